"""Empty key/value cache inputs for LLM graphs (onnxruntime-genai's builder): training feeds ids, mask
and labels, and the ``past_key_values.*`` inputs are given as empty tensors, as for a first prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ort_torch_train.dtypes import torch_dtype
from ort_torch_train.errors import InputError

PAST_PREFIX = "past_key_values."


class Declared(Protocol):
    """What the graph declares for one input."""

    @property
    def name(self) -> str: ...

    @property
    def elem_type(self) -> int: ...

    @property
    def dims(self) -> tuple[int | str | None, ...] | None: ...


def with_empty_past(user_inputs: tuple, declarations: Sequence[Declared]) -> tuple:
    """``user_inputs`` with an empty past tensor inserted for each ``past_key_values.*`` input, when the
    inputs given are exactly the graph's other inputs; otherwise ``user_inputs`` unchanged."""
    if len(user_inputs) >= len(declarations) or not user_inputs:  # every input given: the usual case, no scan
        return user_inputs
    past = [d for d in declarations if d.name.startswith(PAST_PREFIX)]
    if not past or len(user_inputs) != len(declarations) - len(past):
        return user_inputs
    batch = _batch_size(user_inputs[0])
    given = iter(user_inputs)
    filled: list[Any] = []
    for declaration in declarations:
        if declaration.name.startswith(PAST_PREFIX):
            filled.append(_empty_past(declaration, batch))
        else:
            filled.append(next(given))
    return tuple(filled)


def _batch_size(first: Any) -> int:
    shape = getattr(first, "shape", None)
    if shape is None and hasattr(first, "numpy"):
        shape = first.numpy().shape
    if not shape:
        raise InputError(
            f"past_key_values.*: left out, so the first input sizes the empty cache; expected a batch (input_ids), "
            f"got {type(first).__name__} of shape {shape!r}"
        )
    return int(shape[0])


def _empty_past(declaration: Declared, batch: int) -> torch.Tensor:
    """``(batch, kv_heads, 0, head_size)``: the declared dims where they are numbers, 0 past positions."""
    dims = declaration.dims or (None, None, None, None)
    shape = [batch] + [d if isinstance(d, int) and d > 0 else 0 for d in dims[1:]]
    if len(shape) >= 3:
        shape[2] = 0
    return torch.empty(shape, dtype=torch_dtype(declaration.elem_type))


__all__ = ["PAST_PREFIX", "with_empty_past"]
