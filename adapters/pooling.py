"""MaxPool (with ONNX's flattened Indices), AveragePool (incl. opset 19 dilations), LpPool, MaxUnpool, GlobalAverage/MaxPool.

torch's pooling runs directly when the ONNX pads are symmetric and small enough for it; otherwise
the input is padded explicitly. ceil_mode follows ONNX: a last window starting in the right padding
is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import EllipsisType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .common import Inline, OperationConverterResult, attributes, input_shape, result
from .index_checks import checked_indices, index_source
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_MAX_POOL: dict[int, Callable[..., Any]] = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _geometry(
    node: OnnxNode, graph: OnnxGraph
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int], bool]:
    """sizes, kernel, strides, dilations, pad begins, pad ends, ceil_mode (auto_pad resolved)."""
    attrs = attributes(node)
    sizes = list(input_shape(node, graph, 0)[2:])
    rank = len(sizes)
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1] * rank))
    dilations = list(attrs.get("dilations", [1] * rank))
    pads = list(attrs.get("pads", [0] * (2 * rank)))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        totals = _totals(sizes, kernel, strides, dilations)
        begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = begins + [t - b for t, b in zip(totals, begins)]
    elif auto_pad == "VALID":
        pads = [0] * (2 * rank)
    elif auto_pad != "NOTSET":
        raise NotImplementedError(f"{node.operation_type}: attribute auto_pad={auto_pad!r} is not supported")
    if rank not in _MAX_POOL:
        raise NotImplementedError(f"{node.operation_type} with {rank} spatial dimensions is not supported")
    return sizes, kernel, strides, dilations, pads[:rank], pads[rank:], bool(attrs.get("ceil_mode", 0))


def _totals(sizes, kernel, strides, dilations) -> list[int]:
    """SAME padding in total per axis: enough for ceil(size / stride) outputs."""
    geometry = zip(sizes, kernel, strides, dilations)
    return [max(0, (math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n) for n, k, s, d in geometry]


def _output_sizes(sizes, kernel, strides, dilations, begins, ends, ceil_mode: bool) -> list[int]:
    out = []
    for n, k, s, d, b, e in zip(sizes, kernel, strides, dilations, begins, ends):
        span = n + b + e - ((k - 1) * d + 1)
        count = (math.ceil(span / s) if ceil_mode else span // s) + 1
        if ceil_mode and (count - 1) * s >= n + b:
            count -= 1
        out.append(count)
    return out


def _torch_native(kernel, dilations, begins, ends) -> bool:
    return begins == ends and all(2 * p <= (k - 1) * d + 1 for p, k, d in zip(begins, kernel, dilations))


def _f_pad(begins, ends) -> list[int]:
    """F.pad's order: last dim first."""
    return [p for b, e in zip(reversed(begins), reversed(ends)) for p in (b, e)]


# MaxPool ------------------------------------------------------------------------------------------
def max_pool(
    x: torch.Tensor,
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    begins: list[int],
    ends: list[int],
    ceil_mode: bool,
    out_sizes: list[int],
    with_indices: bool,
    column_major: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """ONNX MaxPool; with ``with_indices`` also the flattened (N, C, *spatial) index of each maximum."""
    rank = len(kernel)
    native = _torch_native(kernel, dilations, begins, ends)
    source = x if native else F.pad(x, _f_pad(begins, ends), value=-math.inf)
    padding = begins if native else [0] * rank
    pooled = _MAX_POOL[rank](source, kernel, strides, padding, dilations, ceil_mode, return_indices=with_indices)
    cropped: tuple[EllipsisType | slice, ...] = (Ellipsis, *(slice(0, size) for size in out_sizes))
    if not with_indices:
        return pooled[cropped]
    y, indices = pooled[0][cropped], pooled[1][cropped]
    return y, _onnx_indices(indices, x.shape, source.shape, [0] * rank if native else begins, column_major)


def _onnx_indices(indices: torch.Tensor, shape, pooled_shape, begins, column_major: bool) -> torch.Tensor:
    """torch's per-plane indices into the (padded) input -> ONNX's index into the whole input."""
    spatial, padded = list(shape[2:]), list(pooled_shape[2:])
    coordinates = []
    for size in reversed(padded):
        coordinates.append(indices % size)
        indices = torch.div(indices, size, rounding_mode="floor")
    coordinates = [c - b for c, b in zip(reversed(coordinates), begins)]
    flat = torch.zeros_like(coordinates[0])
    order = reversed(range(len(spatial))) if column_major else range(len(spatial))
    for axis in order:
        flat = flat * spatial[axis] + coordinates[axis]
    planes = math.prod(spatial)
    planes_shape = (shape[0], shape[1], *[1] * len(spatial))
    plane_index = torch.arange(shape[0] * shape[1], device=indices.device).reshape(planes_shape)
    return flat + plane_index * planes


@register("MaxPool", since=1)
def max_pool_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    sizes, kernel, strides, dilations, begins, ends, ceil_mode = _geometry(node, graph)
    out_sizes = _output_sizes(sizes, kernel, strides, dilations, begins, ends, ceil_mode)
    with_indices = len(node.output_values) > 1 and bool(node.output_values[1])
    column_major = attributes(node).get("storage_order", 0) == 1
    args = (kernel, strides, dilations, begins, ends, ceil_mode, out_sizes, with_indices, column_major)
    if not with_indices and _torch_native(kernel, dilations, begins, ends):
        return result(Inline(_MAX_POOL[len(kernel)], kernel, strides, begins, dilations, ceil_mode), node)
    return result(Inline(max_pool, *args), node)


# AveragePool --------------------------------------------------------------------------------------
def average_pool(
    x: torch.Tensor,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    begins: Sequence[int],
    ends: Sequence[int],
    out_sizes: Sequence[int],
    count_include_pad: bool,
) -> torch.Tensor:
    """ONNX AveragePool by explicit windows: any pads, dilations, ceil overflow excluded from the count."""
    rank = len(kernel)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    padded = [n + b + e for n, b, e in zip(x.shape[2:], begins, ends)]
    overflow = [max(0, (o - 1) * s + span - size) for o, s, span, size in zip(out_sizes, strides, spans, padded)]
    padded_ends = [e + extra for e, extra in zip(ends, overflow)]
    windows = _windows(F.pad(x, _f_pad(begins, padded_ends)), spans, strides, dilations)
    window_dims = tuple(range(-rank, 0))
    total = windows.sum(window_dims)
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    if count_include_pad:
        ones = F.pad(ones, _f_pad(begins, ends), value=1.0)
        ones = F.pad(ones, _f_pad([0] * rank, overflow))
    else:
        ones = F.pad(ones, _f_pad(begins, padded_ends))
    counts = _windows(ones, spans, strides, dilations).sum(window_dims)
    return total / counts


def _windows(x: torch.Tensor, spans, strides, dilations) -> torch.Tensor:
    """(N, C, *out, *kernel) view of the windows of ``x`` (already padded)."""
    for axis, (span, stride) in enumerate(zip(spans, strides)):
        x = x.unfold(2 + axis, span, stride)
    index: tuple[EllipsisType | slice, ...] = (Ellipsis, *(slice(None, None, d) for d in dilations))
    return x[index]


@register("AveragePool", since=1)
def average_pool_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    sizes, kernel, strides, dilations, begins, ends, ceil_mode = _geometry(node, graph)
    include_pad = bool(attributes(node).get("count_include_pad", 0))
    out_sizes = _output_sizes(sizes, kernel, strides, dilations, begins, ends, ceil_mode)
    torch_pads_ok = begins == ends and all(2 * p <= k for p, k in zip(begins, kernel))
    if torch_pads_ok and all(d == 1 for d in dilations):
        return result(Inline(_AVG_POOL[len(kernel)], kernel, strides, begins, ceil_mode, include_pad), node)
    return result(Inline(average_pool, kernel, strides, dilations, begins, ends, out_sizes, include_pad), node)


# Global pools -------------------------------------------------------------------------------------
def _spatial_dims(node: OnnxNode, graph: OnnxGraph) -> tuple[int, ...]:
    return tuple(range(2, len(input_shape(node, graph, 0))))


@register("GlobalAveragePool", since=1)
def global_average_pool(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(torch.mean, _spatial_dims(node, graph), True), node)


@register("GlobalMaxPool", since=1)
def global_max_pool(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(torch.amax, _spatial_dims(node, graph), True), node)


# LpPool -------------------------------------------------------------------------------------------
def lp_pool(
    x: torch.Tensor,
    p: float,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    begins: Sequence[int],
    ends: Sequence[int],
    out_sizes: Sequence[int],
) -> torch.Tensor:
    """ONNX LpPool: ``(sum over the window of |x|^p)^(1/p)``, pads counting as zeros."""
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    padded = [n + b + e for n, b, e in zip(x.shape[2:], begins, ends)]
    overflow = [max(0, (o - 1) * s + span - size) for o, s, span, size in zip(out_sizes, strides, spans, padded)]
    powered = F.pad(x.abs().pow(p), _f_pad(begins, [e + extra for e, extra in zip(ends, overflow)]))
    windows = _windows(powered, spans, strides, dilations)
    return windows.sum(tuple(range(-len(kernel), 0))).pow(1.0 / p)


@register("LpPool", since=2)
def lp_pool_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    sizes, kernel, strides, dilations, begins, ends, ceil_mode = _geometry(node, graph)
    out_sizes = _output_sizes(sizes, kernel, strides, dilations, begins, ends, ceil_mode)
    p = float(attributes(node).get("p", 2))
    return result(Inline(lp_pool, p, kernel, strides, dilations, begins, ends, out_sizes), node)


# MaxUnpool ----------------------------------------------------------------------------------------
def max_unpool(
    x: torch.Tensor,
    indices: torch.Tensor,
    output_shape: torch.Tensor | None = None,
    *,
    inferred: list[int],
    source: tuple[str, str],
) -> torch.Tensor:
    """ONNX MaxUnpool: values put back at their flat indices; ``output_shape`` (read at run time) pads the end."""
    size = math.prod(inferred)
    flat = checked_indices(indices.reshape(-1), 0, size, *source)
    out = x.new_zeros(size).scatter(0, flat, x.reshape(-1)).reshape(inferred)
    if output_shape is None:
        return out
    extra = [int(want) - have for want, have in zip(output_shape.tolist(), inferred)]
    return F.pad(out, [p for e in reversed(extra) for p in (0, e)])


@register("MaxUnpool", since=9, shape_inputs=(2,))
def max_unpool_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    shape = input_shape(node, graph, 0)
    kernel = list(attrs["kernel_shape"])
    rank = len(kernel)
    strides, pads = list(attrs.get("strides", [1] * rank)), list(attrs.get("pads", [0] * (2 * rank)))
    inferred = [
        *shape[:2],
        *((n - 1) * s - (pads[i] + pads[rank + i]) + k for i, (n, s, k) in enumerate(zip(shape[2:], strides, kernel))),
    ]
    return result(Inline(max_unpool, inferred=inferred, source=index_source(node, 1)), node)
