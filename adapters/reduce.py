"""Reduce* ops for opsets 1-21: axes as an attribute (before 18; ReduceSum before 13) or an input.

Constant axes are baked in; an empty axes list reduces everything unless noop_with_empty_axes, where
only the elementwise part of composite reductions remains (ReduceLogSum -> log, ReduceL1 -> abs...).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    constant_ints,
    has_input,
    input_shape,
    normalize_axis,
    result,
)
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def reduce_sum(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Sum over ``dims`` (none: ``x`` itself)."""
    return torch.sum(x, dims, keepdim) if dims else x


def reduce_mean(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Mean over ``dims``."""
    return torch.mean(x, dims, keepdim) if dims else x


def reduce_max(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Maximum over ``dims`` (over an empty set: the dtype's lowest value, -inf for floats, as ONNX)."""
    if any(x.shape[d] == 0 for d in dims):
        return _over_empty(x, dims, keepdim, lowest=True)
    return torch.amax(x, dims, keepdim) if dims else x


def reduce_min(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Minimum over ``dims`` (over an empty set: the dtype's highest value, +inf for floats, as ONNX)."""
    if any(x.shape[d] == 0 for d in dims):
        return _over_empty(x, dims, keepdim, lowest=False)
    return torch.amin(x, dims, keepdim) if dims else x


def _over_empty(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool, lowest: bool) -> torch.Tensor:
    fill: bool | float | int
    if x.dtype == torch.bool:
        fill = not lowest
    elif x.is_floating_point():
        fill = -math.inf if lowest else math.inf
    else:
        fill = torch.iinfo(x.dtype).min if lowest else torch.iinfo(x.dtype).max
    shape = [1 if d in dims else n for d, n in enumerate(x.shape) if keepdim or d not in dims]
    return torch.full(shape, fill, dtype=x.dtype, device=x.device)


def reduce_prod(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Product over ``dims``, one dim at a time (torch.prod takes one)."""
    for dim in sorted(dims, reverse=True):
        x = torch.prod(x, dim, keepdim)
    return x


def reduce_l1(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Sum of absolute values."""
    return reduce_sum(x.abs(), dims, keepdim)


def reduce_l2(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Euclidean norm (integers: rounded back to their dtype)."""
    if x.is_floating_point():
        return torch.linalg.vector_norm(x, 2, dims, keepdim) if dims else x.abs()
    return torch.sqrt(reduce_sum(x * x, dims, keepdim).double()).to(x.dtype)


def reduce_log_sum(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Log of the sum."""
    return torch.log(reduce_sum(x, dims, keepdim))


def reduce_log_sum_exp(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Log of the sum of exponentials, stably."""
    return torch.logsumexp(x, dims, keepdim) if dims else x


def reduce_sum_square(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Sum of squares."""
    return reduce_sum(x * x, dims, keepdim)


_REDUCERS = {
    "ReduceSum": reduce_sum,
    "ReduceMean": reduce_mean,
    "ReduceMax": reduce_max,
    "ReduceMin": reduce_min,
    "ReduceProd": reduce_prod,
    "ReduceL1": reduce_l1,
    "ReduceL2": reduce_l2,
    "ReduceLogSum": reduce_log_sum,
    "ReduceLogSumExp": reduce_log_sum_exp,
    "ReduceSumSquare": reduce_sum_square,
}
# One torch call each when the reduction has at least one dim.
_DIRECT = {
    "ReduceSum": torch.sum,
    "ReduceMean": torch.mean,
    "ReduceMax": torch.amax,
    "ReduceMin": torch.amin,
    "ReduceLogSumExp": torch.logsumexp,
}
_AXES_INPUT_SINCE = {"ReduceSum": 13}  # the others take axes as an input from opset 18 on


def reduce_dynamic(x: torch.Tensor, axes: torch.Tensor, op_type: str, keepdim: bool, noop_empty: bool) -> torch.Tensor:
    """A reduction whose axes are known only at run time."""
    dims = tuple(sorted({axis % x.dim() for axis in axes.tolist()}))
    return _REDUCERS[op_type](x, dims if dims or noop_empty else tuple(range(x.dim())), keepdim)


def _converter(op_type: str):
    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        attrs = attributes(node)
        keepdim = bool(attrs.get("keepdims", 1))
        noop_empty = bool(attrs.get("noop_with_empty_axes", 0))
        rank = len(input_shape(node, graph, 0))
        if context.opset < _AXES_INPUT_SINCE.get(op_type, 18):
            axes = attrs.get("axes")
        else:
            axes = constant_ints(node, graph, 1)
            if axes is None and has_input(node, 1):
                return result(Inline(reduce_dynamic, op_type, keepdim, noop_empty), node)
        if axes:
            dims = tuple(sorted({normalize_axis(axis, rank) for axis in axes}))
        else:  # noop_with_empty_axes: no reduction, but LogSum still takes the log, SumSquare squares...
            dims = () if noop_empty else tuple(range(rank))
        direct = dims and all(input_shape(node, graph, 0)[d] for d in dims)  # (torch refuses empty max/min)
        function = _DIRECT.get(op_type, _REDUCERS[op_type]) if direct else _REDUCERS[op_type]
        return result(Inline(function, dims, keepdim), node, node.input_values[:1])

    return convert


for _op_type in _REDUCERS:
    register(_op_type, since=1, shape_inputs=(1,))(_converter(_op_type))
