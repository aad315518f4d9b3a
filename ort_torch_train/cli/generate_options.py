"""``generate``'s options, one per argument of ``generate_artifacts`` (the command runs in
``cli/generate.py``, imported when it runs)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ort_torch_train.cli.runner import deferred

LOSSES = ("CrossEntropyLoss", "MSELoss", "BCEWithLogitsLoss", "L1Loss", "LanguageModelLoss", "none")
OPTIMIZERS = ("AdamW", "SGD", "none")

DESCRIPTION = """\
Make the four training artifacts (training_model.onnx, eval_model.onnx, optimizer_model.onnx,
checkpoint) from an ONNX model, as generate_artifacts (and ORT's) makes them: the options are its
arguments. --requires-grad names the initializers to train (`all`: every floating-point initializer
with at least one dimension, less --frozen-params); --loss is added after the model's outputs (none:
the model's first output is the loss). Options may also come from --config FILE (YAML, TOML or
JSON; keys as the options' names, `model` for MODEL.onnx); flags on the command line override it.
Every argument is checked and every model built before the first file is written."""

EXAMPLES = """\
examples:
  ort-torch-train generate model.onnx --requires-grad all --loss CrossEntropyLoss --output artifacts
  ort-torch-train generate model.onnx --requires-grad fc.weight,fc.bias --frozen-params emb.weight \\
      --loss MSELoss --optimizer SGD --output artifacts
  ort-torch-train generate model.onnx --requires-grad all --loss LanguageModelLoss \\
      --lora r=8,alpha=16,targets=all-linear --output artifacts
  ort-torch-train generate --config generate.yaml"""


def add_generate_parser(
    commands: argparse._SubParsersAction,
    formatter: type[argparse.HelpFormatter],
    non_negative_int: Callable[[str], int],
) -> argparse.ArgumentParser:
    """Register ``generate`` and its options; return its parser."""
    parser = commands.add_parser(
        "generate",
        help="make the training artifacts from an ONNX model (generate_artifacts)",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument("model", metavar="MODEL.onnx", help="the ONNX model (forward pass, weights as initializers)")
    parser.add_argument(
        "--output", default="artifacts", metavar="DIR", help="the folder the artifacts go to (default ./artifacts)"
    )
    parser.add_argument(
        "--requires-grad",
        required=True,
        metavar="NAME1,NAME2|all",
        help="the initializers to train (all: every floating-point one with a dimension, less --frozen-params)",
    )
    parser.add_argument(
        "--frozen-params", metavar="NAME1,NAME2", help="initializers kept as parameters of the checkpoint, not trained"
    )
    parser.add_argument(
        "--loss",
        required=True,
        choices=LOSSES,
        help="the loss added after the model's outputs (none: the model's first output is the loss)",
    )
    parser.add_argument("--loss-inputs", metavar="NAME1,NAME2", help="the values the loss takes (default: the outputs)")
    parser.add_argument(
        "--optimizer", choices=OPTIMIZERS, default="AdamW", help="the optimizer model to write (default AdamW)"
    )
    parser.add_argument(
        "--additional-outputs", metavar="NAME1,NAME2", help="values the training and eval models also output"
    )
    parser.add_argument("--prefix", default="", help="a prefix for the artifact file names")
    parser.add_argument(
        "--nominal-checkpoint", action="store_true", help="also write nominal_checkpoint (names and dtypes only)"
    )
    parser.add_argument(
        "--lora",
        metavar="r=8,alpha=16,targets=...",
        help="add LoRA adapters, the only trainable parameters (keys r, alpha, dropout, targets, frozen_dtype, seed)",
    )
    parser.add_argument(
        "--external-data-threshold",
        type=non_negative_int,
        metavar="BYTES",
        help="keep initializers in external data files past this size (default: 2 GB for models, 1800 MB "
        "for the checkpoint)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="read options from a YAML, TOML or JSON file (keys: option names, e.g. requires_grad, loss, model)",
    )
    parser.set_defaults(run=deferred("generate", "generate", "run_generate"))
    return parser
