"""Shape-changing ops: Reshape, Squeeze, Unsqueeze, Flatten, Expand, Tile, Transpose, Identity, Shape, Size.

With constant shape inputs (the usual case after folding) each becomes one tensor method call with
the target baked in; a non-constant shape input falls back to a function reading it at run time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    compiling_ahead,
    constant_ints,
    guard_or_false,
    has_input,
    input_dtype,
    input_shape,
    normalize_axis,
    result,
    sizes_of,
)
from .registry import ConversionContext, register
from .size_limits import check_output_size

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


# Reshape ------------------------------------------------------------------------------------------
def _reshape_dims(source: tuple[int, ...] | torch.Size, shape: list[int], allowzero: bool) -> list[int]:
    """ONNX Reshape's target: 0 copies the input's dim unless ``allowzero``; -1 is inferred by torch."""
    if allowzero:
        return list(shape)
    # a dim torch.compile cannot decide is 0 (a size read from data) is taken as that size
    return [source[i] if guard_or_false(dim == 0) else dim for i, dim in enumerate(shape)]


def reshape_dynamic(x: torch.Tensor, shape: torch.Tensor | list, allowzero: bool) -> torch.Tensor:
    """Reshape with a shape known only at run time (a tensor, or sizes a compiled graph computed)."""
    return x.reshape(_reshape_dims(x.shape, sizes_of(shape, least=-1), allowzero))


@register("Reshape", since=1, shape_inputs=(1,))
def reshape(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    allowzero = bool(attrs.get("allowzero", 0))
    if context.opset < 5:
        return result(Inline("reshape", tuple(attrs["shape"])), node, node.input_values[:1])
    shape = constant_ints(node, graph, 1)
    if shape is None:
        return result(Inline(reshape_dynamic, allowzero), node)
    dims = _reshape_dims(input_shape(node, graph, 0), shape, allowzero)
    return result(Inline("reshape", tuple(dims)), node, node.input_values[:1])


# Squeeze / Unsqueeze / Flatten --------------------------------------------------------------------
def _axes(node: OnnxNode, graph: OnnxGraph, context: ConversionContext, since_input: int) -> list[int] | None:
    """The axes of Squeeze/Unsqueeze: an attribute before ``since_input``, an input from it on."""
    if context.opset < since_input:
        return attributes(node).get("axes")
    return constant_ints(node, graph, 1)


def squeeze_dynamic(x: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """Squeeze with an axes tensor known only at run time."""
    return torch.squeeze(x, tuple(axis % x.dim() for axis in axes.tolist()))


@register("Squeeze", since=1, shape_inputs=(1,))
def squeeze(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    shape = input_shape(node, graph, 0)
    axes = _axes(node, graph, context, since_input=13)
    if axes is None and context.opset >= 13 and has_input(node, 1):
        return result(Inline(squeeze_dynamic), node)
    if axes is None:
        axes = [axis for axis, size in enumerate(shape) if size == 1]
    dims = tuple(sorted(normalize_axis(axis, len(shape)) for axis in axes))
    for axis in dims:
        if shape[axis] != 1:
            raise ValueError(f"Squeeze: axis {axis} has size {shape[axis]}, not 1")
    return result(Inline(torch.squeeze, dims), node, node.input_values[:1])


def _unsqueezed(shape: tuple[int, ...] | torch.Size, axes: list[int]) -> list[int]:
    rank = len(shape) + len(axes)
    positions = sorted(normalize_axis(axis, rank) for axis in axes)
    dims = list(shape)
    for position in positions:
        dims.insert(position, 1)
    return dims


def unsqueeze_dynamic(x: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """Unsqueeze with an axes tensor known only at run time."""
    return x.reshape(_unsqueezed(x.shape, axes.tolist()))


@register("Unsqueeze", since=1, shape_inputs=(1,))
def unsqueeze(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    axes = _axes(node, graph, context, since_input=13)
    if axes is None:
        return result(Inline(unsqueeze_dynamic), node)
    shape = input_shape(node, graph, 0)
    if len(axes) == 1:
        return result(Inline(torch.unsqueeze, normalize_axis(axes[0], len(shape) + 1)), node, node.input_values[:1])
    return result(Inline("reshape", tuple(_unsqueezed(shape, axes))), node, node.input_values[:1])


@register("Flatten", since=1)
def flatten(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    shape = input_shape(node, graph, 0)
    axis = attributes(node).get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise ValueError(f"Flatten: axis {axis} is out of range for rank {len(shape)}")
    dims = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    return result(Inline("reshape", dims), node)


# Expand / Tile / Transpose ------------------------------------------------------------------------
def expand_dynamic(x: torch.Tensor, shape: torch.Tensor | list) -> torch.Tensor:
    """Expand (bidirectional broadcast) to a shape known only at run time."""
    dims = tuple(sizes_of(shape))
    # torch's rule where sizes may be symbolic (traced); eagerly, ours, which does not load sympy
    target = torch.broadcast_shapes(x.shape, dims) if compiling_ahead() else broadcast_shape(x.shape, dims)
    check_output_size("Expand", target, x.dtype)
    return x.expand(target)


def broadcast_shape(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    """The shape ``first`` and ``second`` broadcast to (numpy's rule, as Expand's), or RuntimeError as
    ``torch.broadcast_shapes`` raises (which loads sympy, unused otherwise in eager graphs)."""
    rank = max(len(first), len(second))
    padded = [(1,) * (rank - len(shape)) + tuple(shape) for shape in (first, second)]
    if any(a != b and 1 not in (a, b) for a, b in zip(*padded)):
        raise RuntimeError(f"shape mismatch: {list(first)} and {list(second)} cannot be broadcast to a single shape")
    return tuple(b if a == 1 else a for a, b in zip(*padded))


@register("Expand", since=8, shape_inputs=(1,))
def expand(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    shape = constant_ints(node, graph, 1)
    if shape is None:
        return result(Inline(expand_dynamic), node)
    target = broadcast_shape(input_shape(node, graph, 0), tuple(shape))
    check_output_size("Expand", target, input_dtype(node, graph, 0))
    return result(Inline("expand", target), node, node.input_values[:1])


def tile_dynamic(x: torch.Tensor, repeats: torch.Tensor | list) -> torch.Tensor:
    """Tile with repeats known only at run time."""
    counts = sizes_of(repeats)
    check_output_size("Tile", [size * count for size, count in zip(x.shape, counts)], x.dtype)
    return x.repeat(counts)


@register("Tile", since=6, shape_inputs=(1,))
def tile(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    repeats = constant_ints(node, graph, 1)
    if repeats is None:
        return result(Inline(tile_dynamic), node)
    sizes = [size * count for size, count in zip(input_shape(node, graph, 0), repeats)]
    check_output_size("Tile", sizes, input_dtype(node, graph, 0))
    return result(Inline("repeat", tuple(repeats)), node, node.input_values[:1])


@register("Transpose", since=1)
def transpose(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = len(input_shape(node, graph, 0))
    perm = attributes(node).get("perm", list(reversed(range(rank))))
    return result(Inline("permute", tuple(normalize_axis(axis, rank) for axis in perm)), node)


# Identity / Shape / Size --------------------------------------------------------------------------
def identity(x: torch.Tensor) -> torch.Tensor:
    """The input itself."""
    return x


@register("Identity", since=1)
def identity_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(identity), node)


def shape_of(x: torch.Tensor, start: int, end: int | None) -> torch.Tensor:
    """``x.shape[start:end]`` as an int64 tensor (ONNX clamps out-of-range bounds, as slicing does)."""
    return torch.tensor(x.shape[start:end], dtype=torch.int64)


@register("Shape", since=1)
def shape(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(Inline(shape_of, attrs.get("start", 0), attrs.get("end")), node)


def size_of(x: torch.Tensor) -> torch.Tensor:
    """The element count of ``x`` as an int64 scalar tensor."""
    return torch.tensor(x.numel(), dtype=torch.int64)


@register("Size", since=1)
def size(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(size_of), node)
