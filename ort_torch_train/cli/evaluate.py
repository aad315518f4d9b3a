"""``ort-torch-train evaluate``: a checkpoint's eval loss and metrics on a data file, nothing written."""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from ort_torch_train.api import Module
from ort_torch_train.cli.common import CliError, load_trained_artifacts
from ort_torch_train.cli.data import check_arrays, input_specs, load_data, select_arrays
from ort_torch_train.cli.export import lora_setting
from ort_torch_train.cli.train import NEEDS_MODEL_OUTPUTS, chunks
from ort_torch_train.graph.layout import eval_layout
from ort_torch_train.trainer import evaluate, metric_named, with_model_outputs


def run_evaluate(args: argparse.Namespace) -> None:
    """Print the eval loss and ``--metric``s of the checkpoint on ``--data`` (text or ``--json``)."""
    result = evaluation(args)
    print(json.dumps(result, indent=2) if args.json else render(result))


def evaluation(args: argparse.Namespace) -> dict[str, Any]:
    """The checkpoint, the sample count and each metric's value."""
    training_model, eval_model, checkpoint, state = load_trained_artifacts(args.artifacts, args.checkpoint, "evaluate")
    names = ["loss"] + [name for name in dict.fromkeys(args.metric or []) if name != "loss"]
    metrics = [metric_named(name) for name in names]  # an unknown name fails before any model is built
    param_names = list(state.params)
    if any(name not in NEEDS_MODEL_OUTPUTS for name in names):
        eval_model = with_model_outputs(eval_model, param_names)
    specs = input_specs(eval_model, list(eval_layout(eval_model, param_names).user_inputs))
    loaded, table = load_data(args.data)
    arrays = select_arrays(loaded, specs, args.inputs, repr(args.data), "--inputs", table)
    samples = check_arrays(arrays, specs, repr(args.data))
    if samples == 0:
        raise CliError(f"--data {str(args.data)!r} holds no samples")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    module = Module(
        training_model,
        state,
        eval_model,
        device=device,
        lora=lora_setting(None, state, training_model),
    )
    values = evaluate(module, chunks(list(arrays.values()), args.batch_size), metrics)
    return {"checkpoint": str(checkpoint), "data": str(args.data), "samples": samples, "metrics": values}


def render(result: dict[str, Any]) -> str:
    """The evaluation as lines of text."""
    lines = [f"{result['checkpoint']} on {result['data']} ({result['samples']} samples):"]
    lines += [f"  eval {name} {value:.6g}" for name, value in result["metrics"].items()]
    return "\n".join(lines)
