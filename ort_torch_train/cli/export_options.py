"""``export``'s options (the command runs in ``cli/export.py``, imported when it runs)."""

from __future__ import annotations

import argparse

from ort_torch_train.cli.runner import deferred

DESCRIPTION = """\
Write the inference model of a set of artifacts with a checkpoint's parameters (LoRA adapters merged
into their weights), and for LoRA training also the unmerged model, whose adapters are overridable
inputs, and the adapters as an onnxruntime .onnx_adapter file (onnxruntime.LoraAdapter loads it;
several adapters trained on one base run on one unmerged model). The LoRA config comes from the
models (generate_artifacts(lora=...)), from the checkpoint (train --lora keeps it there) or --lora."""


def add_export_parser(commands: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Register ``export`` and its options."""
    parser = commands.add_parser(
        "export",
        help="write the inference model, and LoRA's unmerged model and .onnx_adapter",
        description=DESCRIPTION,
        epilog="examples:\n"
        "  ort-torch-train export artifacts/ --checkpoint run/checkpoint --output model.onnx\n"
        "  ort-torch-train export artifacts/ --checkpoint run/checkpoint --unmerged base.onnx --adapter task.onnx_adapter\n"
        "  ort-torch-train export artifacts/ --output model.onnx --external-data\n"
        "  ort-torch-train export artifacts/ --checkpoint run/checkpoint --genai built/ served/",
        formatter_class=formatter,
    )
    parser.add_argument("artifacts", metavar="ARTIFACTS_DIR", help="folder holding the training and eval models")
    parser.add_argument(
        "--checkpoint", metavar="CKPT", help="the parameters to export (default: ARTIFACTS_DIR/checkpoint)"
    )
    parser.add_argument("--output", metavar="MODEL.onnx", help="the inference model, LoRA adapters merged")
    parser.add_argument("--outputs", metavar="NAME1,NAME2", help="graph outputs to export (default: the model's own)")
    parser.add_argument(
        "--external-data", action="store_true", help="keep --output's weights in MODEL.onnx.data (always over 2 GB)"
    )
    parser.add_argument("--unmerged", metavar="MODEL.onnx", help="the LoRA model with the adapters as inputs")
    parser.add_argument("--adapter", metavar="OUT.onnx_adapter", help="the LoRA adapters for onnxruntime.LoraAdapter")
    parser.add_argument(
        "--genai",
        nargs=2,
        metavar=("BUILT_DIR", "OUT_DIR"),
        help="an onnxruntime-genai folder from the model builder's BUILT_DIR: unmerged model, config, tokenizer, adapter",
    )
    parser.add_argument("--adapter-name", default="adapter", help="--genai's adapter file name (default: adapter)")
    parser.add_argument(
        "--accuracy-level",
        type=int,
        choices=range(5),
        metavar="N",
        help="--genai: the int4 MatMulNBits accuracy_level, 0-4 (default: the builder's, 4 on the CPU: int8 "
        "activations; 0 computes in float as training does)",
    )
    parser.add_argument(
        "--lora",
        metavar="r=8,alpha=16,targets=...",
        help="the LoRA config of Module(lora=) (default: the checkpoint's)",
    )
    parser.set_defaults(run=deferred("export", "export", "run_export"))
