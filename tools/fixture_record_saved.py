"""Record what onnxruntime.training.api does with a trained fixture: the saved checkpoints (with and without the
optimizer state), the exported inference model, and training resumed from those checkpoints."""

from __future__ import annotations

import fixture_io as fio
import numpy as np
import onnxruntime as ort
import torch
from fixture_export import initializer_arrays, torch_reference
from fixture_record import FixtureRun, loss_of, maxabs, session_options
from onnxruntime.training.api import CheckpointState, Module, Optimizer


def save_checkpoints(run: FixtureRun, state: CheckpointState) -> dict:
    """Set properties (when the spec has some), save both checkpoint variants, read them back."""
    info: dict = {}
    if run.spec.properties:
        for k, v in run.spec.properties.items():
            state.properties[k] = v
        info["properties_set"] = run.spec.properties
    with_opt, no_opt = run.out / "final_checkpoint_with_optimizer", run.out / "final_checkpoint_no_optimizer"
    CheckpointState.save_checkpoint(state, str(with_opt), include_optimizer_state=True)
    CheckpointState.save_checkpoint(state, str(no_opt), include_optimizer_state=False)
    info["saved_checkpoints"] = {
        "with_optimizer": with_opt.name,
        "bytes_with": with_opt.stat().st_size,
        "no_optimizer": no_opt.name,
        "bytes_without": no_opt.stat().st_size,
    }
    if run.spec.properties:
        info["properties_readback"] = dict(CheckpointState.load_checkpoint(str(with_opt)).properties)
        info["properties_readback_no_optimizer"] = dict(CheckpointState.load_checkpoint(str(no_opt)).properties)
    return info


def inference_export(run: FixtureRun, module: Module, final: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """export_model_for_inferencing with the base model's outputs; run it with InferenceSession."""
    outputs = [o.name for o in run.base.graph.output]
    path = run.out / "inference_model.onnx"
    module.export_model_for_inferencing(str(path), outputs)
    sess = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    feeds = {
        inp.name: run.data[f"{inp.key}_eval"]
        for inp in run.spec.inputs
        if inp.name in {i.name for i in sess.get_inputs()}
    }
    results = dict(zip(outputs, sess.run(outputs, feeds)))
    summary = fio.graph_summary(path)
    values = {**initializer_arrays(run.base), **final}
    ref = torch_reference(run.spec.build_model, values).eval()
    with torch.no_grad():
        torch_out = ref(*(torch.from_numpy(run.data[f"{i.key}_eval"]) for i in run.spec.inputs)).numpy()
    info = {
        "graph_output_names": outputs,
        "inputs": summary["inputs"],
        "outputs": summary["outputs"],
        "op_counts": summary["op_counts"],
        "initializers": [i["name"] for i in summary["initializers"] if i["name"] in final],
        "other_initializers": [i["name"] for i in summary["initializers"] if i["name"] not in final],
        "output_shapes": {k: list(v.shape) for k, v in results.items()},
        "logits_shape": list(results["logits"].shape),
        "max_abs_diff_vs_torch_eval_with_final_params": maxabs(results["logits"], torch_out),
    }
    return info, results


def _two_steps(run: FixtureRun, module: Module, opt: Optimizer) -> list[float]:
    b0 = run.batch("train", 0)
    losses = []
    for _ in range(2):
        module.train()
        losses.append(loss_of(module(*b0)))
        opt.step()
        module.lazy_reset_grad()
    return losses


def resume(run: FixtureRun, module: Module, opt: Optimizer) -> dict:
    """2 more steps on x_train[0]: in-process vs. reloaded saved checkpoints (lr set explicitly)."""
    opt.set_learning_rate(run.spec.lr)
    info = {
        "what": "after the 20 steps (+eval, saves, export): 2 more steps on train batch 0 in-process vs. "
        "after reloading saved checkpoints into fresh Module+Optimizer; lr explicitly set to the "
        "fixture lr in all three",
        "in_process_losses": _two_steps(run, module, opt),
    }
    for tag, name in (
        ("with_optimizer", "final_checkpoint_with_optimizer"),
        ("no_optimizer", "final_checkpoint_no_optimizer"),
    ):
        _, mod2 = run.open(run.out / name)
        opt2 = Optimizer(str(run.art / "optimizer_model.onnx"), mod2)
        if tag == "with_optimizer":
            info["lr_right_after_reload_with_optimizer"] = opt2.get_learning_rate()
        opt2.set_learning_rate(run.spec.lr)
        info[f"reloaded_{tag}_losses"] = _two_steps(run, mod2, opt2)
    info["lr_used"] = run.spec.lr
    return info
