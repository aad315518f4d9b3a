"""Range checks for indices read from data, as ONNX defines them.

An index into an axis of size ``s`` is valid in ``[-s, s)``; negative ones count from the end.
Anything else raises ``IndexRangeError`` naming the op, the input, the value and the range, where
torch would wrap it, read past the end, or fail with a message that names neither.

Eager CPU tensors are checked on the host: ``IndexRangeError`` (an IndexError and a RuntimeError)
names the value too. Compiled graphs (torch.compile's, and a package's steps, traced by make_fx) and CUDA
tensors are checked where they run, without a host synchronisation (``torch._assert_async``, which Dynamo
and make_fx keep and inductor compiles into the step): a compiled CPU step raises a RuntimeError with the
op, the input and the range; on CUDA a bad index stops the process's CUDA work with a device-side assert, as
torch's own kernels do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ort_torch_train.errors import IndexRangeError

from .common import compiling_ahead, tracing_package

if TYPE_CHECKING:
    from onnx2torch.onnx_node import OnnxNode


def index_source(node: OnnxNode, position: int) -> tuple[str, str]:
    """The op and the input an error about the indices at input ``position`` of ``node`` names."""
    name = node.input_values[position] if position < len(node.input_values) else ""
    return f"{node.operation_type} node {node.name!r}", f"input {name!r}"


def wrapped_indices(indices: torch.Tensor, sizes: int | Sequence[int], op: str, name: str) -> torch.Tensor:
    """``indices`` as int64 in ``[0, size)``: negatives count from the end; outside ``[-size, size)`` raises.

    ``sizes`` is one axis size, or one per entry of the last axis (GatherND/ScatterND index tuples).
    ``op`` and ``name`` name the node and its input in the error.
    """
    if tracing_package():  # make_fx's sizes are SymInts: int() would fix each axis to its traced size
        highs = [sizes] if isinstance(sizes, int | torch.SymInt) else list(sizes)
    else:
        highs = [sizes] if isinstance(sizes, int) else [int(size) for size in sizes]
    return _checked(indices.to(torch.int64), [-size for size in highs], highs, True, op, name)


def checked_indices(indices: torch.Tensor, low: int, high: int, op: str, name: str) -> torch.Tensor:
    """``indices`` as int64, raising ``IndexRangeError`` unless every entry lies in ``[low, high)``."""
    return _checked(indices.to(torch.int64), [low], [high], False, op, name)


def check_range(indices: torch.Tensor, low: int, high: int, op: str, name: str) -> int | None:
    """Raise unless every entry of ``indices`` lies in ``[low, high)``: ``IndexRangeError`` with the value on
    the host; a device-side assert with the op, input and range on CUDA and in compiled graphs.

    Returns the smallest entry where the check ran on the host (None otherwise)."""
    if indices.is_cuda or compiling_ahead():  # no test of the count: it may be data-dependent
        message = f"{op}: {name} holds a value outside the valid range {_range_text(low, high)}"
        torch._assert_async(((indices >= low) & (indices < high)).all(), message)
        return None
    if indices.numel() == 0:
        return None
    smallest, largest = [int(value) for value in torch.aminmax(indices)]
    if smallest < low or largest >= high:
        value = smallest if smallest < low else largest
        raise IndexRangeError(
            f"{op}: {name} holds {value}, outside the valid range [{low}, {high})", value, (low, high)
        )
    return smallest


def _range_text(low: int, high: int) -> str:
    """``[low, high)``, or "of its axis" where a bound is a size that varies while tracing: formatting that
    size would fix it to its current value (Dynamo shows a symbolic size as an int, so a bound is told from
    a constant by its value range, a point only for a constant)."""
    if not compiling_ahead():  # eager on CUDA: the bounds are ints (and sympy stays unloaded)
        return f"[{low}, {high})"
    if all(_known_constant(bound) for bound in (low, high)):
        return f"[{low}, {high})"
    return "of its axis"


def _known_constant(size: int) -> bool:
    """Whether ``size`` holds one value whatever the traced graph's inputs, decided without a guard: the
    least bound torch knows above it (found by bisection) is one it knows below it too."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    low, high = -(2**62), 2**62
    if not statically_known_true(size <= high) or not statically_known_true(size >= low):
        return False
    while low < high:
        middle = (low + high) // 2
        if statically_known_true(size <= middle):
            high = middle
        else:
            low = middle + 1
    return statically_known_true(size >= high)


def _checked(indices: torch.Tensor, lows: list[int], highs: list[int], wrap: bool, op: str, name: str) -> torch.Tensor:
    if len(highs) == 1:
        smallest = check_range(indices, lows[0], highs[0], op, name)
        if not wrap or (smallest is not None and smallest >= 0):  # nothing to count from the end
            return indices
        return torch.where(indices < 0, indices + highs[0], indices)
    for column, (low, high) in enumerate(zip(lows, highs)):  # narrowed, not selected: see gather_nd
        check_range(indices.narrow(-1, column, 1), low, high, op, f"{name}[..., {column}]")
    if not wrap:
        return indices
    sizes = torch.tensor(highs, dtype=torch.int64, device=indices.device)
    return torch.where(indices < 0, indices + sizes, indices)
