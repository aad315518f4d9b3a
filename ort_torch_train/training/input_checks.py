"""The user inputs a forward graph declares, and the errors that name an input a batch got wrong."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ort_torch_train.dtypes import dtype_name, onnx_elem_type, ort_tensor_type, torch_dtype
from ort_torch_train.errors import IndexRangeError, InputError, InputTypeError


@dataclass(frozen=True)
class InputDeclaration:
    """What the ONNX graph declares for one user input."""

    name: str
    elem_type: int
    dims: tuple[int | str | None, ...] | None

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.elem_type)


def check_input(declaration: InputDeclaration, position: int, value: object) -> None:
    """Raise InputTypeError or InputError naming the input unless ``value`` is a tensor as ``declaration`` says."""
    name = declaration.name
    if not isinstance(value, torch.Tensor):
        raise InputTypeError(
            f"input {name!r} (position {position}): expected a tensor of {ort_tensor_type(declaration.elem_type)}, "
            f"got {type(value).__name__}"
        )
    if value.dtype != declaration.dtype:
        raise InputTypeError(
            f"Unexpected input data type for input {name!r} (position {position}). "
            f"Actual: ({_type_text(value.dtype)}), expected: ({ort_tensor_type(declaration.elem_type)})"
        )
    dims = declaration.dims
    if dims is None:
        return
    if value.dim() != len(dims):
        raise InputError(
            f"Invalid rank for input: {name} Got: {value.dim()} Expected: {len(dims)} "
            f"(input {name!r} is {_dims_text(dims)}, the batch holds {list(value.shape)}: {_rank_fix(value, dims)})"
        )
    for index, (actual, wanted) in enumerate(zip(value.shape, dims)):
        if isinstance(wanted, int) and actual != wanted:
            raise InputError(
                f"Got invalid dimensions for input: {name} for the following indices index: {index} "
                f"Got: {actual} Expected: {wanted} (the model fixes this dimension: to feed other sizes, "
                f"export it as dynamic, e.g. generate_artifacts(..., dynamic_axes={{{name!r}: {{{index}: 'dim{index}'}}}}) "
                "or dynamic_shapes=)"
            )


def shape_index_error(
    declarations: Sequence[InputDeclaration], inputs: Sequence[torch.Tensor], error: IndexRangeError
) -> IndexRangeError:
    """``error`` (an index out of range while specialising for ``inputs``) with the inputs' shapes it follows from."""
    shapes = ", ".join(f"{d.name!r} {list(t.shape)}" for d, t in zip(declarations, inputs))
    example = ""
    if error.valid is not None:
        example = f", e.g. a sequence longer than a position table that holds {error.valid[1]} positions"
    return IndexRangeError(
        f"{error}: this index follows from the inputs' shapes ({shapes}) and the model's constants, so an input "
        f"is larger than the model allows{example}",
        error.value,
        error.valid,
    )


def _dims_text(dims: tuple[int | str | None, ...]) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in dims) + "]"


def _rank_fix(value: torch.Tensor, dims: tuple[int | str | None, ...]) -> str:
    """How to reshape a batch of the wrong rank, when its sizes allow it."""
    rows = value.shape[0] if value.dim() else 1
    fixed = [dim if isinstance(dim, int) else None for dim in dims[1:]]
    if value.dim() and all(dim is not None for dim in fixed) and value.numel() == rows * math.prod(fixed):  # type: ignore[arg-type]
        target = ", ".join(str(dim) for dim in [rows, *fixed])
        return f"reshape it, e.g. batch.reshape({target})"
    if value.dim() == len(dims) - 1 and dims[-1] == 1:
        return "add the trailing axis, e.g. batch.reshape(-1, 1) for one value per sample"
    if value.dim() == len(dims) + 1:
        return "each call takes one batch: drop the leading axis (a stack of batches?)"
    return f"give {len(dims)} axes, the first one the batch"


def _type_text(dtype: torch.dtype) -> str:
    try:
        return ort_tensor_type(onnx_elem_type(dtype))
    except TypeError:
        return dtype_name(dtype)
