"""``ort-torch-train generate``: the training artifacts of an ONNX model, by ``generate_artifacts``."""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.cli.common import CliError, existing_file, find_artifacts
from ort_torch_train.lora.config import LoraConfig

FLOATING = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)


def run_generate(args: argparse.Namespace) -> None:
    """Write the artifacts and name them on stdout."""
    path = existing_file(args.model, "ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)  # the names and types; generate reads the data
    except Exception as error:  # onnx raises DecodeError, ValueError, ...: all mean "not an ONNX model"
        raise CliError(f"{str(path)!r} is not a readable ONNX model ({str(error).splitlines()[0]})") from error
    frozen = names(args.frozen_params)
    trainable = trainable_names(model, args.requires_grad, frozen)
    try:
        lora = LoraConfig.parse(args.lora) if args.lora else None
    except ValueError as error:
        raise CliError(str(error)) from None
    output = Path(args.output)
    generate_artifacts(
        str(path),
        requires_grad=trainable,
        frozen_params=frozen,
        loss=None if args.loss == "none" else LossType[args.loss],
        optimizer=None if args.optimizer == "none" else OptimType[args.optimizer],
        artifact_directory=output,
        prefix=args.prefix,
        additional_output_names=names(args.additional_outputs),
        nominal_checkpoint=args.nominal_checkpoint,
        loss_input_names=names(args.loss_inputs),
        lora=lora,
        external_data_threshold=args.external_data_threshold,
    )
    written = find_artifacts(output).found() if not args.prefix else {}
    for role, file in written.items():
        print(f"{role.replace('_', ' ')}: {file}")
    if args.prefix:
        print(f"artifacts written to {str(output)!r} with the prefix {args.prefix!r}")
    counts = f"{len(trainable)} trainable parameters, {len(frozen or [])} frozen"
    if args.optimizer == "none":
        print(f"{counts}; no optimizer model (`train` needs one: --optimizer AdamW or SGD)")
    else:
        print(f"{counts}; next: ort-torch-train train {output} --data DATA --max-steps N")


def names(text: str | None) -> list[str] | None:
    """A comma-separated list of names (None when not given)."""
    if text is None:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


def trainable_names(model: onnx.ModelProto, text: str, frozen: list[str] | None) -> list[str]:
    """``--requires-grad``'s names; ``all``: the floating-point initializers with a dimension, less ``frozen``."""
    if text.strip() != "all":
        listed = names(text)
        if not listed:
            raise CliError("--requires-grad: expected initializer names or all, got nothing")
        return listed
    kept = set(frozen or [])
    chosen = [
        tensor.name
        for tensor in model.graph.initializer
        if tensor.data_type in FLOATING and len(tensor.dims) > 0 and tensor.name not in kept
    ]
    if not chosen:
        raise CliError("--requires-grad all: the model has no floating-point initializer with a dimension to train")
    return chosen
