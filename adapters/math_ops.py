"""Scans, selections and rearrangements: CumSum, CumProd, NonZero, TopK, Mod, Einsum, Hardmax,
EyeLike, DepthToSpace, SpaceToDepth.

CumSum replaces onnx2torch's, which defaults ``reverse`` to 1 (ONNX: 0) and widens int32 to int64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ort_torch_train.dtypes import torch_dtype

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    input_dtype,
    input_shape,
    normalize_axis,
    result,
    scalar_constant,
)
from .index_checks import checked_indices, index_source
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def cumulative(
    x: torch.Tensor, axis: torch.Tensor | int, exclusive: bool, reverse: bool, product: bool
) -> torch.Tensor:
    """ONNX CumSum/CumProd along ``axis`` (read at run time when not constant), in ``x``'s dtype."""
    dim = int(axis) % max(x.dim(), 1)
    if reverse:
        x = x.flip(dim)
    out = (torch.cumprod if product else torch.cumsum)(x, dim, dtype=x.dtype)
    if exclusive:
        identity = torch.ones_like if product else torch.zeros_like
        first = identity(x.narrow(dim, 0, 1))
        out = torch.cat([first, out.narrow(dim, 0, x.shape[dim] - 1)], dim)
    return out.flip(dim) if reverse else out


def _cumulative(product: bool):
    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        attrs = attributes(node)
        flags = (bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0)), product)
        axis = scalar_constant(node, graph, 1)
        if axis is None:
            return result(Inline(cumulative, *flags), node)
        return result(Inline(cumulative, int(axis), *flags), node, node.input_values[:1])

    return convert


register("CumSum", since=11)(_cumulative(product=False))
register("CumProd", since=26)(_cumulative(product=True))


def nonzero(x: torch.Tensor) -> torch.Tensor:
    """ONNX NonZero: indices as a ``(rank, count)`` int64 tensor (torch's is ``(count, rank)``)."""
    return torch.nonzero(x).t()


@register("NonZero", since=9, data_dependent_shape=True)
def nonzero_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(nonzero), node)


def top_k_stable(x: torch.Tensor, k: torch.Tensor | int, axis: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top k with ties taken in index order (ONNX's rule), via a stable full sort."""
    values, indices = torch.sort(x, dim=axis, descending=largest, stable=True)
    return values.narrow(axis, 0, int(k)), indices.narrow(axis, 0, int(k))


@register("TopK", since=10, shape_inputs=(1,))
def top_k_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    axis = normalize_axis(attrs.get("axis", -1), len(input_shape(node, graph, 0)))
    largest = bool(attrs.get("largest", 1))
    return result(Inline(top_k_stable, axis=axis, largest=largest), node)


def mod(a: torch.Tensor, b: torch.Tensor, fmod: bool) -> torch.Tensor:
    if fmod:
        return torch.fmod(a, b)
    if not a.dtype.is_floating_point:
        b = torch.where(b == 0, torch.ones_like(b), b)  # undefined in ONNX; avoids a crash
    return torch.remainder(a, b)


@register("Mod", since=10)
def mod_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(mod, fmod=bool(attributes(node).get("fmod", 0))), node)


@register("Einsum", since=12)
def einsum_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    equation = attributes(node)["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else equation
    return result(Inline(einsum, equation=equation.replace(" ", "")), node)


def einsum(*operands: torch.Tensor, equation: str) -> torch.Tensor:
    return torch.einsum(equation, *operands)


def hardmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    """One-hot of the first maximum along ``axis`` (opset 13 semantics)."""
    index = torch.argmax(x, axis, keepdim=True)
    return torch.zeros_like(x).scatter_(axis, index, 1)


def hardmax_flattened(x: torch.Tensor, axis: int) -> torch.Tensor:
    """Opset < 13: hardmax over all dims from ``axis`` on, taken together."""
    flat = x.reshape(*x.shape[:axis], -1) if axis else x.reshape(1, -1)
    return hardmax(flat, flat.dim() - 1).reshape(x.shape)


@register("Hardmax", since=1)
def hardmax_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = len(input_shape(node, graph, 0))
    axis = normalize_axis(attributes(node).get("axis", -1 if context.opset >= 13 else 1), rank)
    if context.opset >= 13 or axis == rank - 1:
        return result(Inline(hardmax, axis), node)
    return result(Inline(hardmax_flattened, axis), node)


@register("EyeLike", since=9)
def eye_like_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    dtype = torch_dtype(attrs["dtype"]) if "dtype" in attrs else input_dtype(node, graph, 0)
    return result(Inline(diagonal_ones, attrs.get("k", 0), dtype), node)


def diagonal_ones(x: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """A matrix of ``x``'s shape with ones on diagonal ``k``."""
    return torch.ones(x.shape, dtype=torch.float32, device=x.device).triu(k).tril(k).to(dtype)


def depth_to_space(x: torch.Tensor, block: int, column_row: bool) -> torch.Tensor:
    n, c, h, w = x.shape
    if column_row:  # CRD
        y = x.reshape(n, c // block**2, block, block, h, w).permute(0, 1, 4, 2, 5, 3)
    else:  # DCR
        y = x.reshape(n, block, block, c // block**2, h, w).permute(0, 3, 4, 1, 5, 2)
    return y.reshape(n, c // block**2, h * block, w * block)


def space_to_depth(x: torch.Tensor, block: int, column_row: bool) -> torch.Tensor:
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // block, block, w // block, block)
    y = y.permute(0, 1, 3, 5, 2, 4) if column_row else y.permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * block**2, h // block, w // block)


def _block_rearrange_op(function):
    """A converter calling ``function(x, blocksize, column_row)``; ``mode="CRD"`` is column-row order."""

    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        attrs = attributes(node)
        mode = attrs.get("mode", "DCR")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        return result(Inline(function, attrs["blocksize"], mode == "CRD"), node)

    return convert


register("DepthToSpace", since=1)(_block_rearrange_op(depth_to_space))
register("SpaceToDepth", since=1)(_block_rearrange_op(space_to_depth))


def compress(x: torch.Tensor, condition: torch.Tensor, axis: int | None) -> torch.Tensor:
    """Entries along ``axis`` (of the flattened input without one) where ``condition`` holds."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    keep = torch.nonzero(condition.reshape(-1)[: x.shape[axis]]).reshape(-1)
    return x.index_select(axis, keep)


@register("Compress", since=9, data_dependent_shape=True)
def compress_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    axis = attributes(node).get("axis")
    if axis is not None:
        axis = normalize_axis(axis, len(input_shape(node, graph, 0)))
    return result(Inline(compress, axis=axis), node)


def reverse_sequence(
    x: torch.Tensor, lengths: torch.Tensor, batch_axis: int, time_axis: int, source: tuple[str, str]
) -> torch.Tensor:
    """Reverse the first ``lengths[b]`` steps of each batch entry ``b`` along ``time_axis``."""
    steps = torch.arange(x.shape[time_axis], device=x.device)
    lengths = checked_indices(lengths, 0, x.shape[time_axis] + 1, *source)
    shape = [1] * x.dim()
    shape[time_axis], shape[batch_axis] = -1, 1
    grid = steps.reshape(shape)
    shape[time_axis], shape[batch_axis] = 1, -1
    limit = lengths.reshape(shape)
    index = torch.where(grid < limit, limit - 1 - grid, grid).expand(x.shape)
    return torch.gather(x, time_axis, index)


@register("ReverseSequence", since=10)
def reverse_sequence_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    axes = attrs.get("batch_axis", 1), attrs.get("time_axis", 0)
    return result(Inline(reverse_sequence, *axes, index_source(node, 1)), node)


@register("Det", since=11)
def det_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(torch.linalg.det), node)
