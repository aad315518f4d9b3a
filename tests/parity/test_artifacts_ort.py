"""What ORT 1.19.2 itself can load of our generated artifacts (the table in docs/artifacts.md).

Claims, checked in ORT's own venv: the checkpoint and nominal checkpoint load; the eval model loads in
InferenceSession and, with ORT's training model (ORT builds the gradient graph), serves ORT's Module
together with our optimizer model and checkpoint, reproducing ORT's recorded run; our training model
is refused by ORT's Module (it has no gradient graph).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from tests.helpers.artifacts_support import generate_arguments, input_keys, load_expected
from tests.helpers.corpus import corpus_cases
from tests.helpers.ort_peer import requires_ort, run_ort
from tests.helpers.timeouts import scaled
from tests.unit.artifacts.test_artifacts_torch import CNN, GPT, HAS_ONNXSCRIPT, data

pytestmark = [*requires_ort, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]

CORPUS_SCRIPT = r"""
import json, sys
import numpy as np
import onnxruntime as ort
from onnxruntime.training.api import CheckpointState, Module, Optimizer

ort.set_default_logger_severity(3)
results = {}
for job in json.loads(sys.argv[1]):
    case, ours, keys = job["case"], job["ours"], job["keys"]
    result = results[case] = {}
    state = CheckpointState.load_checkpoint(ours + "/checkpoint")
    reference = CheckpointState.load_checkpoint(case + "/artifacts/checkpoint")
    result["parameters"] = [[name, bool(p.requires_grad)] for name, p in state.parameters]
    result["same_values"] = all(np.array_equal(p.data, reference.parameters[name].data) for name, p in state.parameters)
    try:
        nominal = CheckpointState.load_checkpoint(ours + "/nominal_checkpoint")
        result["nominal_parameter_count"] = len(nominal.parameters)
    except Exception as exc:
        result["nominal_error"] = str(exc)[-200:]
    session = ort.InferenceSession(ours + "/eval_model.onnx", providers=["CPUExecutionProvider"])
    result["inference_inputs"] = [i.name for i in session.get_inputs()]
    try:
        Module(ours + "/training_model.onnx", CheckpointState.load_checkpoint(ours + "/checkpoint"))
        result["our_training_model"] = "loaded"
    except Exception as exc:
        result["our_training_model"] = str(exc)[-200:]
    module = Module(case + "/artifacts/training_model.onnx", state, ours + "/eval_model.onnx")
    optimizer = Optimizer(ours + "/optimizer_model.onnx", module)
    data = np.load(case + "/data.npz")
    losses = []
    for step, lr in enumerate(job["lrs"]):
        optimizer.set_learning_rate(lr)
        module.train()
        out = module(*[data[k + "_train"][step] for k in keys], data["y_train"][step])
        losses.append(np.asarray(out[0] if isinstance(out, tuple) else out).item())
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    out = module(*[data[k + "_eval"] for k in keys], data["y_eval"])
    result["losses"], result["eval_loss"] = losses, np.asarray(out[0] if isinstance(out, tuple) else out).item()
print(json.dumps(results))
"""

INFERENCE_SCRIPT = r"""
import json, sys
import numpy as np
import onnxruntime as ort
losses = []
for job in json.loads(sys.argv[1]):
    session = ort.InferenceSession(job["model"], providers=["CPUExecutionProvider"])
    feeds = {name: np.load(path) for name, path in job["feeds"].items()}
    losses.append(np.asarray(session.run(None, feeds)[0]).item())
print(json.dumps(losses))
"""


@pytest.mark.slow
def test_ort_loads_and_trains_with_our_checkpoint_eval_and_optimizer_models(tmp_path: Path) -> None:
    cases = corpus_cases()
    if not cases:
        pytest.skip("no refcorpus or fixtures found")
    jobs, expectations = [], {}
    for index, case in enumerate(cases):
        expected = load_expected(case)
        ours = tmp_path / str(index)
        generate_artifacts(
            str(case / "base_model.onnx"),
            artifact_directory=ours,
            **{**generate_arguments(expected), "nominal_checkpoint": True},
        )
        jobs.append(
            {
                "case": str(case),
                "ours": str(ours),
                "keys": input_keys(expected),
                "lrs": expected["train"]["lr_before_each_step"],
            }
        )
        expectations[str(case)] = expected
    results = run_ort(CORPUS_SCRIPT, json.dumps(jobs), timeout=scaled(600))

    for case, result in results.items():
        expected = expectations[case]
        spec = expected["generate_artifacts"]
        assert sorted(result["parameters"]) == sorted(
            [[name, True] for name in spec["requires_grad"]] + [[name, False] for name in spec["frozen_params"]]
        )
        assert result["same_values"], case
        assert result.get("nominal_parameter_count") == len(result["parameters"]), result.get("nominal_error")
        assert "Gradient buffer input not provided for param" in result["our_training_model"], case
        if "nondeterminism_note" not in expected:  # Dropout: ORT's RNG differs run to run here
            np.testing.assert_allclose(result["losses"], expected["train"]["losses"], rtol=0, atol=1e-6, err_msg=case)
            # ORT 1.19.2 on this CPU against ORT where the corpus was made: its kernels differ per ISA
            np.testing.assert_allclose(
                result["eval_loss"], expected["train"]["eval_loss"], rtol=0, atol=1e-5, err_msg=case
            )


@pytest.mark.slow
def test_ort_runs_the_eval_models_of_exported_torch_modules(tmp_path: Path) -> None:
    """ORT 1.19.2's InferenceSession computes the same loss on our eval models as our Module."""
    from ort_torch_train.api.checkpoint_state import CheckpointState
    from ort_torch_train.api.module import Module

    exporters = ["legacy", "dynamo"] if HAS_ONNXSCRIPT else ["legacy"]
    jobs, ours = [], []
    for family, build in (("cnn", CNN), ("gpt", GPT)):
        for exporter in exporters:
            directory = tmp_path / f"{family}-{exporter}"
            torch.manual_seed(0)
            x, y = data(family)
            generate_artifacts(
                build(),
                loss=LossType.CrossEntropyLoss,
                optimizer=OptimType.AdamW,
                artifact_directory=directory,
                example_inputs=(x,),
                exporter=exporter,
            )
            state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
            module = Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
            ours.append(np.asarray(module.eval()(x.numpy(), y.numpy())).item())
            feeds = {module.input_names()[0]: x.numpy(), "labels": y.numpy()}
            feeds.update({name: np.array(p.data) for name, p in state.parameters})
            paths = {name: str(directory / f"feed{index}.npy") for index, name in enumerate(feeds)}
            for name, path in paths.items():
                np.save(path, feeds[name])
            jobs.append({"model": str(directory / "eval_model.onnx"), "feeds": paths})
    np.testing.assert_allclose(run_ort(INFERENCE_SCRIPT, json.dumps(jobs)), ours, rtol=1e-5, atol=1e-6)
