"""``ort-torch-train inspect``: what a set of training artifacts holds, as text or JSON."""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

import onnx

from ort_torch_train.checkpoint.summary import CheckpointSummary, ParameterSummary
from ort_torch_train.cli.common import (
    ArtifactPaths,
    classify_paths,
    load_checkpoint_summary,
    load_onnx,
    shape_text,
    short_float,
    trainable_names_of,
    value_dtype,
    value_shape,
)
from ort_torch_train.graph.layout import GraphLayout, eval_layout, opsets_of, training_layout
from ort_torch_train.lora.config import LORA_PROPERTY, LoraConfig
from ort_torch_train.lora.record import read_record
from ort_torch_train.optim.optimizer_model import read_optimizer_model


def run_inspect(args: argparse.Namespace) -> None:
    """Print the report on ``args.paths`` (a folder or individual files)."""
    report = inspect_artifacts(classify_paths(args.paths))
    print(json.dumps(report, indent=2) if args.json else render_text(report))


def inspect_artifacts(paths: ArtifactPaths) -> dict[str, Any]:
    """A JSON-ready description of the models, parameters, optimizer and checkpoint."""
    report: dict[str, Any] = {"files": paths.found()}
    state = load_checkpoint_summary(paths.checkpoint) if paths.checkpoint else None
    training = load_onnx(paths.training_model, "training model") if paths.training_model else None
    evaluation = load_onnx(paths.eval_model, "eval model") if paths.eval_model else None
    if state is not None:
        param_names = [param.name for param in state.parameters]
    elif training is not None:
        param_names = trainable_names_of(training)
        report["note"] = (
            "no checkpoint: parameters are the trainable ones of the training model; frozen ones show as inputs"
        )
    else:
        param_names = []
    if training is not None:
        report["training_model"] = _describe_model(training, training_layout(training, param_names))
        if state is not None:
            mismatched = _mismatched_parameters(state, training)
            if mismatched:
                report["warning"] = f"the checkpoint does not fit the training model: {'; '.join(mismatched)}"
    if evaluation is not None:
        report["eval_model"] = _describe_model(evaluation, eval_layout(evaluation, param_names))
    report["parameters"] = _describe_parameters(state, param_names, [m for m in (training, evaluation) if m])
    lora = _describe_lora(state, training or evaluation)
    if lora is not None:
        report["lora"] = lora
    if paths.optimizer_model:
        report["optimizer"] = _describe_optimizer(paths.optimizer_model)
    if state is not None:
        report["checkpoint"] = _describe_checkpoint(state)
    return report


def _describe_optimizer(path: str | os.PathLike) -> dict[str, Any]:
    spec = read_optimizer_model(path)
    hyperparameters = {
        **spec.algorithm.reported(spec.hyperparameters),
        "clip_max_norm": spec.clip_max_norm,
        "has_update_signal": spec.has_update_signal,
    }
    return {
        "algorithm": spec.algorithm.display_name,
        "hyperparameters": {k: short_float(v) if isinstance(v, float) else v for k, v in hyperparameters.items()},
    }


def _mismatched_parameters(state: CheckpointSummary, training: onnx.ModelProto) -> list[str]:
    """Checkpoint parameters the training model does not take, or declares with another shape."""
    declared = {value.name: value_shape(value) for value in training.graph.input}
    problems = []
    for param in state.parameters:
        name = param.name
        if name not in declared:
            problems.append(f"{name} is no input of it")
            continue
        shape = declared[name]
        if (
            param.shape is not None
            and shape is not None
            and all(isinstance(d, int) for d in shape)
            and shape != param.shape
        ):
            problems.append(f"{name} is {param.shape}, the model declares {shape}")
    return problems


def _describe_model(model: onnx.ModelProto, layout: GraphLayout) -> dict[str, Any]:
    values = {v.name: v for v in (*model.graph.input, *model.graph.output, *model.graph.value_info)}

    def describe(name: str) -> dict[str, Any]:
        value = values.get(name, onnx.ValueInfoProto(name=name))
        return {"name": name, "dtype": value_dtype(value), "shape": value_shape(value)}

    return {
        "opset": opsets_of(model).get("", None),
        "nodes": len(model.graph.node),
        "inputs": [describe(name) for name in layout.user_inputs],
        "outputs": [describe(name) for name in layout.user_outputs],
    }


def _describe_parameters(
    state: CheckpointSummary | None, names: list[str], models: list[onnx.ModelProto]
) -> list[dict]:
    declared = {v.name: v for model in models for v in model.graph.input}
    params: dict[str, ParameterSummary] = {p.name: p for p in state.parameters} if state is not None else {}
    described = []
    for name in names:
        shape: list[int] | list[int | str | None] | None
        if state is not None and not state.is_nominal:
            dtype, shape = params[name].dtype, params[name].shape
        else:  # a nominal checkpoint stores no shapes: take the models' declarations
            value = declared.get(name, onnx.ValueInfoProto(name=name))
            dtype = params[name].dtype if state is not None else value_dtype(value)
            shape = value_shape(value) if name in declared else None
        trainable = params[name].trainable if state is not None else True
        described.append({"name": name, "dtype": dtype, "shape": shape, "trainable": trainable})
    return described


def _describe_lora(state: CheckpointSummary | None, model: onnx.ModelProto | None) -> dict[str, Any] | None:
    """The adapters the models carry (generate_artifacts(lora=)) or the checkpoint's LoRA config (Module(lora=))."""
    record = read_record(model) if model is not None else None
    if record is not None:
        return {
            "source": "models",
            "r": record.rank,
            "alpha": short_float(record.alpha),
            "scaling": short_float(record.scaling),
            "adapters": [
                {"weight": t.weight, "lora_A": t.lora_a, "lora_B": t.lora_b, "in": t.in_features, "out": t.out_features}
                for t in record.targets
            ],
        }
    kept = state.properties.get(LORA_PROPERTY) if state is not None else None
    if state is None or not isinstance(kept, str):
        return None
    config = LoraConfig.from_json(kept)
    return {
        "source": "checkpoint",
        "r": config.r,
        "alpha": short_float(config.alpha),
        "scaling": short_float(config.scaling),
        "targets": list(config.targets),
        "adapters": [{"name": param.name} for param in state.parameters if param.trainable],
    }


def _describe_checkpoint(state: CheckpointSummary) -> dict[str, Any]:
    groups = []
    if state.optimizer is not None:
        opt = state.optimizer
        moments = sorted({key for moments in opt.momentums.values() for key in moments})
        groups.append(
            {
                "name": opt.name,
                "step": opt.step,
                "initial_lr": short_float(opt.initial_learning_rate),
                "moments": moments,
                "parameters_with_moments": len(opt.momentums),
            }
        )
    properties = {
        name: short_float(value) if isinstance(value, float) else value
        for name, value in sorted(state.properties.items())
    }
    return {
        "nominal": state.is_nominal,
        "external_data": state.has_external_data,
        "optimizer_groups": groups,
        "properties": properties,
    }


def render_text(report: dict[str, Any]) -> str:
    """The report as aligned, human-readable lines."""
    lines = [f"{role.replace('_', ' ')}: {path}" for role, path in report["files"].items()]
    lines += [f"{key}: {report[key]}" for key in ("note", "warning") if key in report]
    for key, title in (("training_model", "training model"), ("eval_model", "eval model")):
        if key in report:
            model = report[key]
            lines += ["", f"{title} (opset {model['opset']}, {model['nodes']} nodes)"]
            lines += _table(
                [
                    [kind, v["name"], v["dtype"], shape_text(v["shape"])]
                    for kind in ("input", "output")
                    for v in model[kind + "s"]
                ]
            )
    params = report["parameters"]
    if params:
        sizes = [_numel(p["shape"]) for p in params]
        trainable = [size for size, p in zip(sizes, params) if p["trainable"]]
        lines += [
            "",
            f"parameters: {len(params)} ({len(trainable)} trainable); "
            f"elements: {_count(sizes)} ({_count(trainable)} trainable)",
        ]
        lines += _table(
            [
                [p["name"], p["dtype"], shape_text(p["shape"]), "trainable" if p["trainable"] else "frozen"]
                for p in params
            ]
        )
    if "lora" in report:
        lines += _render_lora(report["lora"])
    if "optimizer" in report:
        opt = report["optimizer"]
        settings = ", ".join(f"{k} {_setting(v)}" for k, v in opt["hyperparameters"].items())
        lines += ["", f"optimizer: {opt['algorithm']} (the learning rate is set at run time)", f"  {settings}"]
    if "checkpoint" in report:
        ckpt = report["checkpoint"]
        lines += [
            "",
            f"checkpoint: {'nominal (names and dtypes only, no values)' if ckpt['nominal'] else 'complete'}"
            f"{', data in external file' if ckpt['external_data'] else ''}",
        ]
        if not ckpt["optimizer_groups"]:
            lines.append("  optimizer state: none")
        for group in ckpt["optimizer_groups"]:
            lines.append(
                f"  optimizer group {group['name']}: step {group['step']}, initial lr {group['initial_lr']}, "
                f"moments {', '.join(group['moments']) or 'none'} "
                f"for {group['parameters_with_moments']} parameters"
            )
        properties = ckpt["properties"]
        lines.append("  properties: " + (", ".join(f"{k}={v!r}" for k, v in properties.items()) or "none"))
    return "\n".join(lines)


def _render_lora(lora: dict[str, Any]) -> list[str]:
    adapters = lora["adapters"]
    where = "in the models" if lora["source"] == "models" else f"from the checkpoint, targets {lora['targets']}"
    lines = [
        "",
        f"LoRA ({where}): r {lora['r']}, alpha {lora['alpha']} (scale {lora['scaling']}); "
        f"{len(adapters)} {'adapted weights' if lora['source'] == 'models' else 'adapter tensors'} "
        "(adapters trainable, every other parameter frozen)",
    ]
    if lora["source"] == "models":
        lines += _table([[a["weight"], f"{a['in']}x{a['out']}", a["lora_A"], a["lora_B"]] for a in adapters])
    return lines


def _setting(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(rows: list[list[str]], indent: int = 2) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return [" " * indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _numel(shape: list | None) -> int | None:
    if shape is None or not all(isinstance(dim, int) for dim in shape):
        return None
    return math.prod(shape)


def _count(sizes: list[int | None]) -> str:
    known = [size for size in sizes if size is not None]
    return "?" if len(known) < len(sizes) else f"{sum(known):,}"
