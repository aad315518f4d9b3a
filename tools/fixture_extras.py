"""Fixture-specific observations: nominal checkpoint, dropout probe, BatchNorm stats, optimizer variants."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import fixture_io as fio
import numpy as np
import onnx
from fixture_export import generate, reset_name_counter
from fixture_record import FixtureRun, as_tuple, capture, loss_of, maxabs, param_values, session_options
from fixture_specs import STEPS
from onnx import numpy_helper
from onnxruntime.capi.onnxruntime_inference_collection import OrtValue
from onnxruntime.training import onnxblock
from onnxruntime.training.api import CheckpointState, Module, Optimizer

# ----------------------------------------------------------------------------- nominal checkpoint


def full_buffer(run: FixtureRun, init: dict[str, np.ndarray], state: CheckpointState) -> np.ndarray:
    """All parameters concatenated in training-graph input order."""
    return np.concatenate([init[n].ravel() for n in run.param_order(state)]).astype(np.float32)


def nominal_behaviour(run: FixtureRun, init: dict[str, np.ndarray], first_loss: float) -> dict:
    """What ORT allows and refuses on a nominal checkpoint, before and after loading parameters."""
    state = CheckpointState.load_checkpoint(str(run.art / "nominal_checkpoint"))
    names = list(state._state.parameter_names())  # noqa: SLF001
    first = sorted(names)[-1]
    info: dict = {
        "parameter_names": names,
        "iterate_state_parameters": capture(lambda: list(state.parameters)),
        "len_state_parameters": capture(lambda: len(state.parameters)),
        f"contains_{first}": capture(lambda: first in state.parameters),
    }
    module = Module(
        str(run.art / "training_model.onnx"), state, str(run.art / "eval_model.onnx"), session_options=session_options()
    )
    info.update({f"get_parameters_size_{t}": module.get_parameters_size(t) for t in (True, False)})
    b0 = run.batch("train", 0)
    buf = full_buffer(run, init, state)
    info["param_data_access"] = capture(lambda: state.parameters[first].data)
    info["train_before_loading_params"] = capture(lambda: module(*b0))
    info["eval_before_loading_params"] = capture(lambda: module.eval()(*run.batch("eval")))
    module.train()
    info["export_before_loading_params"] = capture(
        lambda: module.export_model_for_inferencing(str(run.out / "_never.onnx"), ["logits"])
    )
    info["get_contiguous_parameters_before_loading"] = capture(lambda: module.get_contiguous_parameters(False))
    info["copy_buffer_to_parameters_with_python_OrtValue"] = capture(
        lambda: module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(buf), False)
    )
    info["copy_buffer_to_parameters_trainable_only_True"] = capture(
        lambda: module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(buf)._ortvalue, True)
    )
    info["copy_buffer_to_parameters_trainable_only_False"] = capture(
        lambda: module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(buf)._ortvalue, False)
    )
    info["param_data_after_loading_equals_init"] = capture(
        lambda: all(np.array_equal(state.parameters[n].data, init[n]) for n in names)
    )
    info["loss_after_loading_params"] = capture(lambda: loss_of(module(*b0)))
    info["expected_loss_same_as_full_checkpoint_first_call"] = first_loss
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "ck"
        info["save_after_loading"] = capture(lambda: CheckpointState.save_checkpoint(state, str(saved)))
        info["saved_is_nominal_state"] = fio.read_checkpoint(saved)["module_state"]["is_nominal_state"]
    (run.out / "_never.onnx").unlink(missing_ok=True)
    return info


# ----------------------------------------------------------------------------- dropout


def dropout_probe(run: FixtureRun, args: dict) -> dict:
    """Re-generate throw-away artifacts exposing the ReLU and Dropout outputs; measure the mask."""
    nodes = {n.op_type: n for n in run.base.graph.node}
    relu_out, drop_out = nodes["Relu"].output[0], nodes["Dropout"].output[0]
    with tempfile.TemporaryDirectory() as tmp:
        probe = FixtureRun(run.spec, Path(tmp), run.data, run.base)
        generate(run.spec, run.out / "base_model.onnx", probe.art, args, [relu_out, drop_out], probe=True)
        state, module = probe.open()
        kept, total, ratios = 0, 0, []
        for i in range(STEPS):
            _, relu, drop = as_tuple(module.train()(*run.batch("train", i)))
            live = relu > 0
            kept += int(np.count_nonzero(drop[live]))
            total += int(np.count_nonzero(live))
            ratios.extend((drop[live & (drop != 0)] / relu[live & (drop != 0)]).tolist())
        _, relu_e, drop_e = as_tuple(module.eval()(*run.batch("eval")))
    ratios_arr = np.array(ratios)
    return {
        "how": "separate throw-away artifacts with additional_output_names=[ReLU output, Dropout output]; "
        "20 train calls on the train batches; counts over positions where ReLU output > 0",
        "relu_output": relu_out,
        "dropout_output": drop_out,
        "train_fraction_zeroed": 1.0 - kept / total,
        "positive_positions": total,
        "kept_scale_min": float(ratios_arr.min()),
        "kept_scale_max": float(ratios_arr.max()),
        "eval_dropout_is_identity": bool(np.array_equal(relu_e, drop_e)),
    }


# ----------------------------------------------------------------------------- batchnorm stats


def batchnorm_stats_check(run: FixtureRun, lr: float) -> dict:
    """Replay training and compare ORT's running-stat update with biased/unbiased variance."""
    state, module = run.open()
    opt = Optimizer(str(run.art / "optimizer_model.onnx"), module)
    opt.set_learning_rate(lr)
    diffs = {"biased_var_momentum_0.9": 0.0, "unbiased_var_momentum_0.9": 0.0, "mean_momentum_0.9": 0.0}
    for i in range(STEPS):
        p = param_values(state)
        x, y = run.batch("train", i)
        h = x @ p["0.weight"].T + p["0.bias"]
        module.train()(x, y)
        new_mean, new_var = state.parameters["1.running_mean"].data, state.parameters["1.running_var"].data
        exp_mean = 0.9 * p["1.running_mean"] + 0.1 * h.mean(0)
        diffs["mean_momentum_0.9"] = max(diffs["mean_momentum_0.9"], maxabs(new_mean, exp_mean))
        for tag, ddof in (("biased", 0), ("unbiased", 1)):
            exp_var = 0.9 * p["1.running_var"] + 0.1 * h.var(0, ddof=ddof)
            key = f"{tag}_var_momentum_0.9"
            diffs[key] = max(diffs[key], maxabs(new_var, exp_var))
        opt.step()
        module.lazy_reset_grad()
    return {
        "how": "before each train call compute h = x @ W0.T + b0 from the current parameters; after it "
        "compare ORT's running stats with 0.9*old + 0.1*batch_stat (max abs diff over 20 steps)",
        "max_abs_diff": diffs,
    }


# ----------------------------------------------------------------------------- optimizer variants


@dataclass
class Variant:
    """One optimizer model for mlp_optimizers: how it is built and which attributes are edited."""

    name: str
    description: str
    kind: str  # AdamW | SGD
    block_kwargs: dict = field(default_factory=dict)
    max_norm: float | None = None
    edits: dict = field(default_factory=dict)


MAX_NORM = 0.25

VARIANTS = [
    Variant(
        "adamw_wd_clip",
        "onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=ClipGradNorm(0.25))",
        "AdamW",
        {"weight_decay": 0.01},
        MAX_NORM,
    ),
    Variant(
        "adamw_mode0_wd_clip",
        "adamw_wd_clip with the AdamWOptimizer attribute edited to adam_mode=0",
        "AdamW",
        {"weight_decay": 0.01},
        MAX_NORM,
        {"adam_mode": 0},
    ),
    Variant(
        "adamw_nocorrect_wd_clip",
        "adamw_wd_clip with correct_bias=0 (adam_mode stays 1)",
        "AdamW",
        {"weight_decay": 0.01, "bias_correction": False},
        MAX_NORM,
    ),
    Variant(
        "adamw_betas_eps_wd",
        "onnxblock.optim.AdamW(betas=(0.8, 0.95), eps=1e-8, weight_decay=0.05), no clip",
        "AdamW",
        {"betas": (0.8, 0.95), "eps": 1e-8, "weight_decay": 0.05},
    ),
    Variant(
        "adamw_mode0_nocorrect",
        "AdamW with adam_mode=0 and correct_bias=0 (ORT requires correct_bias=1 for mode 0)",
        "AdamW",
        {"bias_correction": False},
        None,
        {"adam_mode": 0},
    ),
    Variant("sgd", "onnxblock.optim.SGD()", "SGD"),
    Variant("sgd_clip", "onnxblock.optim.SGD(clip_grad=ClipGradNorm(0.25))", "SGD", {}, MAX_NORM),
]


def build_optimizer_model(variant: Variant, trainable: list[onnx.TensorProto], path: Path) -> dict:
    """Build the optimizer graph exactly as generate_artifacts does, then apply attribute edits."""
    clip = onnxblock.optim.ClipGradNorm(variant.max_norm) if variant.max_norm is not None else None
    cls = {"AdamW": onnxblock.optim.AdamW, "SGD": onnxblock.optim.SGD}[variant.kind]
    block = cls(clip_grad=clip, **variant.block_kwargs)
    reset_name_counter()
    with onnxblock.empty_base(opset_version=17):
        block((trainable, []))
        model = block.to_model_proto()
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name in variant.edits:
                attr.i = int(variant.edits[attr.name])
    onnx.save(model, str(path))
    return fio.optimizer_node_summary(path)


RUNNER = Path(__file__).resolve().parent / "fixture_optim_runner.py"
RUNNER_ENV = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "LC_ALL": "C",
}


def _stage_runner_dir(run: FixtureRun, path: Path, job: dict, tmp: Path) -> None:
    """Copy what the runner needs under fixed names into its scratch directory."""
    (tmp / "artifacts").mkdir()
    for name in ("training_model.onnx", "eval_model.onnx", "checkpoint"):
        shutil.copyfile(run.art / name, tmp / "artifacts" / name)
    shutil.copyfile(run.out / "data.npz", tmp / "data.npz")
    shutil.copyfile(path, tmp / "optimizer.onnx")
    (tmp / "job.json").write_text(json.dumps(job))


def run_variant(run: FixtureRun, variant: Variant, path: Path, lr: float) -> tuple[dict, dict]:
    """20 ORT steps with one optimizer model, in a reproducible subprocess (see fixture_optim_runner)."""
    job = {"lr": lr, "keys": [i.key for i in run.spec.inputs], "tag": variant.name}
    with tempfile.TemporaryDirectory() as tmp:
        _stage_runner_dir(run, path, job, Path(tmp))
        proc = subprocess.run(
            fio.no_aslr_prefix() + [sys.executable, str(RUNNER)],
            capture_output=True,
            text=True,
            cwd=tmp,
            env=RUNNER_ENV,
        )
        if proc.returncode:
            raise RuntimeError(f"optimizer runner failed for {variant.name}:\n{proc.stderr}")
        info = json.loads((Path(tmp) / "result.json").read_text())
        with np.load(Path(tmp) / "arrays.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
    info["run_in"] = (
        "tools/fixture_optim_runner.py: setarch -R (when available), env "
        + json.dumps(RUNNER_ENV)
        + ", no arguments, fixed file names"
    )
    return info, arrays


def optimizer_variants(run: FixtureRun, lr: float) -> tuple[dict, dict]:
    """Build every optimizer variant under optimizers/ and record an ORT trajectory for each."""
    out_dir = run.out / "optimizers"
    out_dir.mkdir(exist_ok=True)
    state = CheckpointState.load_checkpoint(str(run.art / "checkpoint"))
    trainable = [numpy_helper.from_array(np.array(p.data), n) for n, p in state.parameters if p.requires_grad]
    info, arrays = {}, {}
    for v in VARIANTS:
        path = out_dir / f"{v.name}.onnx"
        entry = {
            "file": f"optimizers/{v.name}.onnx",
            "description": v.description,
            "built_with": {"block": f"onnxblock.optim.{v.kind}", "kwargs": v.block_kwargs, "clip_max_norm": v.max_norm},
            "attribute_edits": v.edits,
        }
        entry["model"] = build_optimizer_model(v, trainable, path)
        result, arr = run_variant(run, v, path, lr)
        entry.update(result)
        info[v.name] = entry
        arrays.update(arr)
    return info, arrays
