"""Checks of the values a TrainingState takes: property values as ORT stores them, parameter data."""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import CheckpointError, ParameterDataError, PropertyError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


def source_text(source: str | os.PathLike | bytes | bytearray | memoryview) -> str:
    """A checkpoint source as log lines name it: its path, or its length for bytes."""
    return f"({len(source)} bytes)" if isinstance(source, (bytes, bytearray, memoryview)) else repr(os.fspath(source))


def normalize_property(name: str, value: object) -> int | float | str:
    """The value as ORT stores it: int (int64 range), float (rounded to float32) or str."""
    if not isinstance(name, str):
        raise PropertyError(f"Property names must be str, got {type(name).__name__} {name!r}")
    _require_utf8(name, f"Property name {name!r}")
    if isinstance(value, bool | np.bool_):
        raise PropertyError(f"Property {name!r} value is a bool; properties hold int, float or str")
    if isinstance(value, str):
        _require_utf8(value, f"Property {name!r} value")
        return value
    if isinstance(value, int | np.integer):
        if not INT64_MIN <= int(value) <= INT64_MAX:
            raise PropertyError(f"Property {name!r} value {int(value)} does not fit in int64")
        return int(value)
    if isinstance(value, float | np.floating):
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise PropertyError(f"Property {name!r} value {float(value)} does not fit in float32")
        return float(np.float32(value))
    raise PropertyError(f"Property {name!r} value has type {type(value).__name__}; properties hold int, float or str")


def _require_utf8(text: str, what: str) -> None:
    """Refuse text that cannot be written as UTF-8 (a lone surrogate would break every later save)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PropertyError(
            f"{what} cannot be stored: it is not valid Unicode text ({error.reason} at position {error.start})"
        ) from None


def shape_text(shape: torch.Size | tuple[int, ...]) -> str:
    """A shape as ORT's messages write it: ``{2,3}``."""
    return "{" + ",".join(str(dim) for dim in shape) + "}"


def as_tensor(name: str, value: object) -> torch.Tensor:
    """Parameter ``name``'s new data as a tensor (numpy arrays shared, not copied); TypeError for other types."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray | np.generic):
        try:
            return torch.as_tensor(np.asarray(value))
        except TypeError:
            raise TypeError(
                f"Parameter {name} data has numpy dtype {value.dtype}, which no torch tensor can hold"
            ) from None
    raise TypeError(f"Parameter {name} data must be a numpy.ndarray or torch.Tensor, got {type(value).__name__}")


def check_dtype(name: str, expected: torch.dtype, got: torch.dtype) -> None:
    """Raise ORT's ParameterDataError unless parameter ``name``'s new data has its dtype."""
    if got != expected:
        raise ParameterDataError(
            f"Parameter {name}: Parameter data type mismatch. Expected: {dtype_name(expected)}, Got: {dtype_name(got)}"
        )


def checked_value(name: str, param: torch.Tensor, value: object) -> torch.Tensor:
    """Parameter ``name``'s new data as a tensor after checking it against ``param``'s shape and dtype (ORT's
    ParameterDataError texts)."""
    tensor = as_tensor(name, value)
    if tensor.shape != param.shape:
        raise ParameterDataError(
            f"Parameter {name}: Parameter data shape mismatch. "
            f"Expected: {shape_text(param.shape)}, Got: {shape_text(tensor.shape)}"
        )
    check_dtype(name, param.dtype, tensor.dtype)
    return tensor


def check_same_names(expected: set[str], got: set[str], what: str, error: type) -> None:
    """Raise ``error`` naming the missing and unexpected names unless ``got`` is ``expected``."""
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        raise error(f"{what} must hold exactly the state's parameters; missing: {missing}, unexpected: {unexpected}")


def new_parameter(name: str, tensor: torch.Tensor, trainable: bool) -> torch.nn.Parameter:
    """``tensor`` as parameter ``name`` (no copy); only floating-point tensors can be ``trainable``."""
    if trainable and not (tensor.is_floating_point() or tensor.is_complex()):
        raise CheckpointError(
            f"trainable parameter {name!r} has dtype {dtype_name(tensor.dtype)}; "
            "only floating-point parameters can require gradients"
        )
    return torch.nn.Parameter(tensor, requires_grad=trainable)
