"""``ort-torch-train convert``: parameters between ORT checkpoints, safetensors files and torch state_dicts."""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import torch

from ort_torch_train.checkpoint.safetensors import load_safetensors, save_safetensors
from ort_torch_train.cli.common import CliError, existing_file, find_artifacts, load_training_state
from ort_torch_train.dtypes import dtype_name
from ort_torch_train.fileio import atomic_write
from ort_torch_train.state.training_state import TrainingState

SUFFIX_FORMATS = {".safetensors": "safetensors", ".pt": "pt", ".pth": "pt"}


def run_convert(args: argparse.Namespace) -> None:
    """Read SRC's parameters and write them to DST in the target format."""
    source, target = Path(args.src), Path(args.dst)
    src_format = args.from_format or format_of(source)
    dst_format = args.to_format or format_of(target)
    if src_format == dst_format:
        raise CliError(
            f"{args.src!r} and {args.dst!r} are both {src_format}; nothing to convert "
            "(set --from/--to when an extension misleads)"
        )
    if dst_format == "ort" and args.template is None:
        raise CliError(
            "converting into an ORT checkpoint needs --template (an ORT checkpoint or artifacts folder) "
            "to know which parameters are trainable"
        )
    tensors = read_parameters(existing_file(source, "source"), src_format)
    if dst_format == "ort":
        write_ort(tensors, target, template_checkpoint(args.template))
    elif dst_format == "safetensors":
        save_safetensors(tensors, target, metadata={"format": "pt"})
    else:
        atomic_write(target, lambda file: torch.save(tensors, file))
    print(f"wrote {len(tensors)} parameters from {args.src} ({src_format}) to {args.dst} ({dst_format})")


def format_of(path: Path) -> str:
    """The format an extension implies: safetensors, pt, or ort for anything else."""
    return SUFFIX_FORMATS.get(path.suffix.lower(), "ort")


def read_parameters(path: Path, fmt: str) -> dict[str, torch.Tensor]:
    """Parameter name -> CPU tensor, from a file in format ``fmt``."""
    if fmt == "ort":
        state = load_training_state(path)
        if state.is_nominal:
            raise CliError(f"{str(path)!r} is a nominal checkpoint: it holds no parameter values to convert")
        return {name: tensor.cpu().clone() for name, tensor in state.state_dict().items()}  # own storage each
    if fmt == "safetensors":
        return load_safetensors(path)[0]
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "Unsupported global" not in str(error):  # garbage, not a pickle of refused objects
            raise CliError(f"{str(path)!r} is not a file written by torch.save") from error
        raise CliError(
            f"{str(path)!r} holds objects that torch.load(weights_only=True) refuses: "
            "save model.state_dict(), not the model"
        ) from error
    except Exception as error:  # garbage makes torch.load raise about anything
        raise CliError(
            f"{str(path)!r} is not a file written by torch.save ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(loaded, dict) or not all(
        isinstance(name, str) and isinstance(value, torch.Tensor) for name, value in loaded.items()
    ):
        raise CliError(f"{str(path)!r} does not hold a state_dict (a dict of str to tensors)")
    return dict(loaded)


def template_checkpoint(template: str) -> TrainingState:
    """The template's checkpoint: the file itself, or the ``checkpoint`` of an artifacts folder."""
    path = Path(template)
    if path.is_dir():
        path = find_artifacts(path).require("checkpoint", template)
    return load_training_state(existing_file(path, "template checkpoint"))


def write_ort(tensors: dict[str, torch.Tensor], path: Path, template: TrainingState) -> None:
    """Save ``tensors`` as an ORT checkpoint shaped like ``template`` (trainability, properties)."""
    missing = sorted(set(template.params) - set(tensors))
    unexpected = sorted(set(tensors) - set(template.params))
    if missing or unexpected:
        raise CliError(
            f"the parameters do not match the template's: missing {missing or 'none'}, "
            f"not in the template {unexpected or 'none'}"
        )
    for name, param in template.params.items():
        value = tensors[name]
        if value.dtype != param.dtype:
            raise CliError(
                f"parameter {name!r} is {dtype_name(value.dtype)}, the template's is {dtype_name(param.dtype)}"
            )
        if not template.is_nominal and value.shape != param.shape:
            raise CliError(f"parameter {name!r} has shape {list(value.shape)}, the template's is {list(param.shape)}")
    if template.is_nominal:
        template.complete_nominal(tensors)
    else:
        for name, value in tensors.items():
            template.set_parameter_data(name, value)
    template.save(path, include_optimizer_state=False)
