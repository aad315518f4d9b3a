"""Torch -> ONNX export, the documented generate_artifacts workarounds, and artifact generation."""

from __future__ import annotations

import io
import tempfile
import warnings
from pathlib import Path

import fixture_io as fio
import numpy as np
import onnx
import torch
from fixture_specs import FixtureSpec, WeightedMseL1
from onnx import numpy_helper
from onnxruntime.training import artifacts as ort_artifacts
from onnxruntime.training.onnxblock import _graph_utils

OPSET = 17


def export_kwargs(spec: FixtureSpec) -> dict:
    """The torch.onnx.export settings (also recorded in expected.json)."""
    names = [i.name for i in spec.inputs]
    dyn = {n: {0: "batch"} for n in names + ["logits"]}
    return {"input_names": names, "output_names": ["logits"], "dynamic_axes": dyn}


def export_model(spec: FixtureSpec, model: torch.nn.Module, data: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Legacy-export `model` in training mode, opset 17, no constant folding, dynamic batch."""
    args = tuple(torch.from_numpy(data[f"{i.key}_train"][0]) for i in spec.inputs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            args,
            buf,
            dynamo=False,
            opset_version=OPSET,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            **export_kwargs(spec),
        )
    model.load_state_dict(state)  # tracing in training mode may touch BatchNorm buffers
    proto = onnx.load_from_string(buf.getvalue())
    if proto.ir_version > 10:
        raise RuntimeError(f"ir_version {proto.ir_version} > 10: ORT 1.19.2 cannot load it")
    return proto


def patch_layernorm_outputs(model: onnx.ModelProto) -> list[str]:
    """Give every LayerNormalization its optional Mean/InvStdDev outputs (ORT's gradient builder needs them)."""
    patched = []
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            stem = node.name or node.output[0]
            node.output.extend([f"{stem}_saved_mean", f"{stem}_saved_inv_std_dev"])
            patched.append(node.name)
    return patched


def trim_eval_batchnorm_outputs(path: Path, keep_original: Path | None = None) -> list[str]:
    """Drop the running-stat outputs of BatchNormalization(training_mode=0) nodes in the eval model.

    When something is trimmed and keep_original is given, the untouched file is copied there first.
    """
    model = onnx.load(str(path))
    trimmed = []
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or len(node.output) == 1:
            continue
        mode = [a.i for a in node.attribute if a.name == "training_mode"]
        if mode and mode[0] == 1:
            continue
        extra = set(node.output[1:])
        used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        if extra & used:
            raise RuntimeError(f"BatchNormalization {node.name} extra outputs are consumed: {extra & used}")
        del node.output[1:]
        trimmed.append(node.name)
    if trimmed:
        if keep_original is not None:
            keep_original.parent.mkdir(parents=True, exist_ok=True)
            keep_original.write_bytes(path.read_bytes())
        onnx.save(model, str(path))
    return trimmed


def torch_param_names(model: torch.nn.Module) -> list[str]:
    """Names of torch parameters (not buffers), in registration order."""
    return [n for n, _ in model.named_parameters()]


def artifacts_args(spec: FixtureSpec, base: onnx.ModelProto, model: torch.nn.Module) -> dict:
    """requires_grad/frozen_params computed from the base model's initializers and the spec."""
    inits = [i.name for i in base.graph.initializer]
    params = set(torch_param_names(model))
    frozen = spec.frozen(inits)
    requires_grad = [n for n in inits if n in params and n not in frozen]
    return {"requires_grad": requires_grad, "frozen_params": frozen}


def loss_argument(spec: FixtureSpec):
    """The `loss=` argument for generate_artifacts."""
    table = {
        "ce": ort_artifacts.LossType.CrossEntropyLoss,
        "mse": ort_artifacts.LossType.MSELoss,
        "bce": ort_artifacts.LossType.BCEWithLogitsLoss,
        "l1": ort_artifacts.LossType.L1Loss,
    }
    return WeightedMseL1() if spec.loss == "custom" else table[spec.loss]


def reset_name_counter() -> None:
    """onnxblock names nodes from a process-global counter: reset it so every fixture starts equal."""
    _graph_utils._GRAPH_TOKEN = 0  # noqa: SLF001 - deliberate, for reproducible names


def generate(
    spec: FixtureSpec,
    base_path: Path,
    out_dir: Path,
    args: dict,
    additional_output_names: list[str] | None = None,
    probe: bool = False,
    keep_original_eval: Path | None = None,
) -> list[str]:
    """Run generate_artifacts on the saved base model; returns the eval-model BatchNorm patches.

    probe=True makes throw-away artifacts (no nominal checkpoint, given additional outputs).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    reset_name_counter()
    optim = {"AdamW": ort_artifacts.OptimType.AdamW, "SGD": ort_artifacts.OptimType.SGD}[spec.optimizer]
    ort_artifacts.generate_artifacts(
        str(base_path),
        requires_grad=args["requires_grad"],
        frozen_params=args["frozen_params"],
        loss=loss_argument(spec),
        optimizer=optim,
        artifact_directory=str(out_dir),
        nominal_checkpoint=spec.nominal_checkpoint and not probe,
        additional_output_names=additional_output_names if probe else spec.additional_output_names,
    )
    return trim_eval_batchnorm_outputs(out_dir / "eval_model.onnx", keep_original_eval)


def error_without_layernorm_patch(spec: FixtureSpec, unpatched: Path, args: dict) -> str | None:
    """generate_artifacts on the unpatched export, to record ORT's exact refusal."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            generate(spec, unpatched, Path(tmp), args, probe=True)
        except Exception as exc:  # noqa: BLE001 - the message is the record
            return fio.scrub(str(exc))
    return None


def error_without_batchnorm_trim(art: Path, untrimmed_eval: Path) -> str | None:
    """Load the untrimmed eval model into an ORT Module (and eval once), to record the refusal."""
    from onnxruntime.training.api import CheckpointState, Module

    try:
        state = CheckpointState.load_checkpoint(str(art / "checkpoint"))
        Module(str(art / "training_model.onnx"), state, str(untrimmed_eval))
    except Exception as exc:  # noqa: BLE001
        return fio.scrub(str(exc))
    return None


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """All initializers of a model as numpy arrays."""
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def torch_reference(build, values: dict[str, np.ndarray]) -> torch.nn.Module:
    """A fresh torch model carrying the given parameter/buffer values (by state_dict name)."""
    model = build()
    sd = model.state_dict()
    with torch.no_grad():
        for name, value in values.items():
            if name in sd:
                sd[name].copy_(torch.from_numpy(np.asarray(value)).reshape(sd[name].shape))
    return model
