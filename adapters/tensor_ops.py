"""Ops over whole axes or index maps: Softmax, LogSoftmax, Trilu, OneHot, ScatterElements, ScatterND, Unique."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    constant_input,
    constant_ints,
    has_input,
    input_shape,
    is_constant,
    normalize_axis,
    result,
)
from .index_checks import index_source, wrapped_indices
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


# Softmax / LogSoftmax -----------------------------------------------------------------------------
def flattened_softmax(x: torch.Tensor, axis: int, log: bool) -> torch.Tensor:
    """Opset < 13 semantics: softmax over all dims from ``axis`` on, taken together."""
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    out = torch.log_softmax(flat, 1) if log else torch.softmax(flat, 1)
    return out.reshape(x.shape)


def _softmax(log: bool):
    function = torch.log_softmax if log else torch.softmax

    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        rank = len(input_shape(node, graph, 0))
        default = -1 if context.opset >= 13 else 1
        axis = normalize_axis(attributes(node).get("axis", default), rank)
        if context.opset >= 13 or axis >= rank - 1:
            return result(Inline(function, axis), node)
        return result(Inline(flattened_softmax, axis, log), node)

    return convert


register("Softmax", since=1)(_softmax(log=False))
register("LogSoftmax", since=1)(_softmax(log=True))


# Trilu --------------------------------------------------------------------------------------------
def trilu_dynamic(x: torch.Tensor, k: torch.Tensor, upper: bool) -> torch.Tensor:
    """Trilu with a diagonal offset known only at run time."""
    return torch.triu(x, int(k)) if upper else torch.tril(x, int(k))


@register("Trilu", since=14)
def trilu(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    upper = bool(attributes(node).get("upper", 1))
    function = torch.triu if upper else torch.tril
    if not has_input(node, 1):
        return result(Inline(function), node)
    k = constant_ints(node, graph, 1)
    if k is None:
        return result(Inline(trilu_dynamic, upper), node)
    return result(Inline(function, k[0]), node, node.input_values[:1])


# OneHot -------------------------------------------------------------------------------------------
def one_hot(indices: torch.Tensor, values: torch.Tensor, depth: int, axis: int) -> torch.Tensor:
    """ONNX OneHot: ``values[1]`` where the (negative-wrapped) index hits, ``values[0]`` elsewhere."""
    indices = indices.to(torch.int64)
    indices = torch.where(indices < 0, indices + depth, indices)
    positions = torch.arange(depth, device=indices.device).reshape([depth] + [1] * (indices.dim() - axis))
    hot = indices.unsqueeze(axis) == positions
    return torch.where(hot, values[1], values[0])


def one_hot_dynamic(indices: torch.Tensor, depth: torch.Tensor, values: torch.Tensor, axis: int) -> torch.Tensor:
    """OneHot with a depth known only at run time."""
    return one_hot(indices, values, int(depth.reshape(-1)[0]), axis)


@register("OneHot", since=9, shape_inputs=(1,))
def one_hot_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = len(input_shape(node, graph, 0))
    axis = normalize_axis(attributes(node).get("axis", -1), rank + 1)
    if not is_constant(node, graph, 1):
        return result(Inline(one_hot_dynamic, axis), node)
    depth = int(constant_input(node, graph, 1).reshape(-1)[0])
    return result(Inline(one_hot, depth, axis), node, [node.input_values[0], node.input_values[2]])


# ScatterElements ----------------------------------------------------------------------------------
_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def scatter_elements(
    data: torch.Tensor,
    indices: torch.Tensor,
    updates: torch.Tensor,
    axis: int,
    reduce: str | None,
    source: tuple[str, str],
) -> torch.Tensor:
    """ONNX ScatterElements (negative indices count from the end)."""
    indices = wrapped_indices(indices, data.shape[axis], *source)
    if reduce is None:
        return data.scatter(axis, indices, updates)
    return data.scatter_reduce(axis, indices, updates, reduce, include_self=True)


@register("ScatterElements", since=11)
@register("Scatter", since=9)
def scatter_elements_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    axis = normalize_axis(attrs.get("axis", 0), len(input_shape(node, graph, 0)))
    reduction = attrs.get("reduction", "none")
    if reduction != "none" and reduction not in _SCATTER_REDUCE:
        raise NotImplementedError(f"ScatterElements: attribute reduction={reduction!r} is not supported")
    return result(Inline(scatter_elements, axis, _SCATTER_REDUCE.get(reduction), index_source(node, 1)), node)


# ScatterND ----------------------------------------------------------------------------------------
_INDEX_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}


def scatter_nd(
    data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, reduction: str, source: tuple[str, str]
) -> torch.Tensor:
    """ONNX ScatterND: ``indices[..., :k]`` address slices of the first k dims of ``data``."""
    depth = indices.shape[-1]
    leading = data.shape[:depth]
    strides = [math.prod(leading[i + 1 :]) for i in range(depth)]
    indices = wrapped_indices(indices, leading, *source)
    flat_index = (indices * torch.tensor(strides, device=data.device)).sum(-1).reshape(-1)
    flat = data.reshape(-1, *data.shape[depth:])
    flat_updates = updates.reshape(-1, *data.shape[depth:])
    if reduction == "none":
        out = flat.index_copy(0, flat_index, flat_updates)
    elif reduction == "add":
        out = flat.index_add(0, flat_index, flat_updates)
    else:
        index = flat_index.reshape(-1, *[1] * (flat.dim() - 1)).expand_as(flat_updates)
        out = flat.scatter_reduce(0, index, flat_updates, _INDEX_REDUCE[reduction], include_self=True)
    return out.reshape(data.shape)


@register("ScatterND", since=11)
def scatter_nd_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    reduction = attributes(node).get("reduction", "none")
    if reduction not in ("none", "add", *_INDEX_REDUCE):
        raise NotImplementedError(f"ScatterND: attribute reduction={reduction!r} is not supported")
    return result(Inline(scatter_nd, reduction, index_source(node, 1)), node)


# Unique -------------------------------------------------------------------------------------------
def unique(x: torch.Tensor, axis: int | None, sort: bool, outputs: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """ONNX Unique: values (sorted, or in order of first occurrence), first indices, inverse indices, counts."""
    flat, dim = (x.reshape(-1), 0) if axis is None else (x, axis)
    values, inverse, counts = torch.unique(flat, sorted=True, return_inverse=True, return_counts=True, dim=dim)
    size = flat.shape[dim]
    first = torch.full((values.shape[dim],), size, dtype=torch.int64, device=x.device)
    first = first.scatter_reduce(0, inverse, torch.arange(size, device=x.device), "amin")
    if not sort:
        order = torch.argsort(first)
        rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=x.device))
        values, first, inverse, counts = values.index_select(dim, order), first[order], rank[inverse], counts[order]
    found = (values, first, inverse.reshape(-1), counts)[:outputs]
    return found if outputs > 1 else values


@register("Unique", since=11, data_dependent_shape=True)
def unique_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    axis = attrs.get("axis")
    if axis is not None:
        axis = normalize_axis(axis, len(input_shape(node, graph, 0)))
    return result(Inline(unique, axis, bool(attrs.get("sorted", 1)), len(node.output_values)), node)
