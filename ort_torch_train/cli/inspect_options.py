"""``inspect``'s options (the command runs in ``cli/inspect.py``, imported when it runs)."""

from __future__ import annotations

import argparse

from ort_torch_train.cli.runner import deferred

DESCRIPTION = """\
Show what a set of training artifacts holds: the user inputs and outputs of the training and eval
models (what you feed and get back; parameters and gradient buffers left out), every parameter with
dtype, shape and trainability, the optimizer and its hyperparameters, and the checkpoint (complete
or nominal, optimizer groups with step count and initial learning rate, properties). Without a
checkpoint, the parameters are the training model's trainable ones. LoRA artifacts and checkpoints
also show their adapters: rank, alpha and the adapted weights (adapters trainable, the rest frozen)."""


def add_inspect_parser(commands: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Register ``inspect`` and its options."""
    parser = commands.add_parser(
        "inspect",
        help="show the models' inputs/outputs, parameters, optimizer and checkpoint",
        description=DESCRIPTION,
        epilog="examples:\n"
        "  ort-torch-train inspect artifacts/\n"
        "  ort-torch-train inspect artifacts/training_model.onnx run/checkpoint\n"
        "  ort-torch-train inspect artifacts/ --json > artifacts.json",
        formatter_class=formatter,
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="an artifacts folder, or individual files: .onnx models (training, eval or "
        "optimizer, told apart by their graphs) and ORT checkpoints",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=deferred("inspect", "inspect", "run_inspect"))
