"""safetensors files, read and written by the ``safetensors`` package; this module adds the project's
errors (naming the file) and atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from ..errors import SafetensorsError
from ..fileio import atomic_write_bytes

METADATA_KEY = "__metadata__"


def _check_to_save(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> None:
    for name, tensor in tensors.items():
        if not isinstance(name, str) or name == METADATA_KEY:
            raise SafetensorsError(
                f"cannot save a tensor named {name!r}: names must be str other than {METADATA_KEY!r}"
            )
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided:
            raise SafetensorsError(f"tensor {name!r} is {tensor.layout}; safetensors files hold dense tensors only")
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """Write tensors (any device; copied to the host) to a safetensors file, atomically.

    Tensors may be non-contiguous, and views of one buffer as long as they do not overlap.
    """
    _check_to_save(tensors, metadata)
    host = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}
    try:
        data = safetensors.torch.save(host, metadata=metadata or None)
    except (ValueError, RuntimeError, KeyError, safetensors.SafetensorError) as error:
        raise SafetensorsError(f"cannot write safetensors file {str(path)!r}: {error}") from None
    atomic_write_bytes(path, data)


def load_safetensors(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file: (CPU tensors by name, metadata). Bad files raise SafetensorsError."""
    label = str(path)
    if Path(path).is_dir():
        raise IsADirectoryError(f"safetensors path {label!r} is a directory, expected a file")
    if not Path(path).exists():
        raise FileNotFoundError(f"safetensors file {label!r} does not exist")
    try:
        with safetensors.safe_open(path, framework="pt") as file:
            tensors = {name: file.get_tensor(name) for name in file.keys()}
            metadata = file.metadata() or {}
    except (safetensors.SafetensorError, ValueError, TypeError, KeyError) as error:
        raise SafetensorsError(f"{label}: not a valid safetensors file ({error})") from None
    return tensors, metadata
