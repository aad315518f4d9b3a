"""Selecting and joining ops: Slice, Gather, GatherElements, GatherND (batch_dims), Split, Concat, Where.

Constant starts/ends/indices/split sizes are baked into one torch call (narrow, select, getitem,
split); non-constant ones fall back to functions that read them at run time.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    clamp_size,
    constant_input,
    constant_ints,
    has_input,
    if_else,
    input_shape,
    is_constant,
    normalize_axis,
    result,
    sizes_of,
    values_of,
)
from .index_checks import check_range, index_source, wrapped_indices
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_INT64_MAX = 2**63 - 1


# Slice --------------------------------------------------------------------------------------------
def _clamped_bounds(size, start, end, step: int) -> tuple:
    """ONNX Slice's start/end for one axis: negatives count from the end, then clamped by step sign.

    ``size``, ``start`` and ``end`` may be symbolic (read from a tensor while torch.compile traces):
    they are combined without deciding anything at trace time (``common.if_else``, ``clamp_size``)."""
    if step == 0:
        raise ValueError("Slice: a step of 0 is not allowed")
    start = if_else(start < 0, start + size, start)
    end = if_else(end < 0, end + size, end)
    if step > 0:
        return clamp_size(start, 0, size), clamp_size(end, 0, size)
    return clamp_size(start, 0, size - 1), clamp_size(end, -1, size - 1)


def _slice_plan(shape, starts, ends, axes, steps) -> tuple[tuple[int, ...], tuple[slice, ...]]:
    """Axes to flip and the positive-step index tuple that together do the ONNX slice."""
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [normalize_axis(axis, rank) for axis in axes]
    steps = [1] * len(starts) if steps is None else steps
    flips, index = [], [slice(None)] * (max(axes, default=-1) + 1)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        start, end = _clamped_bounds(shape[axis], start, end, step)
        if step > 0:
            index[axis] = slice(start, end, step)
        else:  # on the flipped axis, position p is size-1-p; end -1 ("before 0") becomes size
            flips.append(axis)
            index[axis] = slice(shape[axis] - 1 - start, shape[axis] - 1 - end, -step)
    return tuple(flips), tuple(index)


def flip_and_slice(x: torch.Tensor, flips: tuple[int, ...], index: tuple[slice, ...]) -> torch.Tensor:
    """``x`` flipped along ``flips``, then indexed (torch slices have positive steps only)."""
    return x.flip(flips)[index]


def _static_slice(flips: tuple[int, ...], index: tuple[slice, ...]) -> Inline:
    if flips:
        return Inline(flip_and_slice, flips, index)
    cut = [(axis, part) for axis, part in enumerate(index) if part != slice(None)]
    if len(cut) == 1 and cut[0][1].step == 1:
        axis, part = cut[0]
        return Inline("narrow", axis, part.start, max(part.stop - part.start, 0))
    return Inline(operator.getitem, index)


def dynamic_slice(
    x: torch.Tensor,
    starts: torch.Tensor | list,
    ends: torch.Tensor | list,
    axes: list[int] | torch.Tensor | None,
    steps: list[int] | torch.Tensor | None,
) -> torch.Tensor:
    """ONNX Slice whose starts and ends are read at run time; ``axes`` and ``steps`` are the constant
    lists the conversion read (tensors where the graph computes them too)."""
    axis_list = axes.tolist() if isinstance(axes, torch.Tensor) else axes
    step_list = steps.tolist() if isinstance(steps, torch.Tensor) else steps
    flips, index = _slice_plan(x.shape, values_of(starts), values_of(ends), axis_list, step_list)
    return flip_and_slice(x, flips, index) if flips else x[index]


def _slice_operands(node: OnnxNode, graph: OnnxGraph) -> tuple[list[str], list]:
    """The inputs a run-time Slice reads as tensors and the constant ``axes``/``steps`` passed as lists
    (a tensor read while torch.compile traces would be a data-dependent value)."""
    inputs: list[str] = list(node.input_values[:3])
    literals: list[list[int] | int | None] = []
    for position in (3, 4):
        if not has_input(node, position):
            literals.append(None)
        elif is_constant(node, graph, position):
            literals.append(constant_ints(node, graph, position))
        else:
            literals.append(len(inputs))
            inputs.append(node.input_values[position])
    return inputs, literals


class DynamicSlice(nn.Module):
    """Slice whose starts/ends are read at run time and whose axes/steps are computed by the graph too."""

    def forward(
        self,
        x: torch.Tensor,
        starts: torch.Tensor,
        ends: torch.Tensor,
        axes: torch.Tensor | None = None,
        steps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return dynamic_slice(x, starts, ends, axes, steps)


@register("Slice", since=1, shape_inputs=(1, 2, 3, 4))
def slice_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    shape = input_shape(node, graph, 0)
    if context.opset < 10:
        attrs = attributes(node)
        plan = _slice_plan(shape, attrs["starts"], attrs["ends"], attrs.get("axes"), None)
        return result(_static_slice(*plan), node)
    starts, ends, axes, steps = (constant_ints(node, graph, position) for position in range(1, 5))
    dynamic = any(has_input(node, position) and not is_constant(node, graph, position) for position in range(1, 5))
    if not dynamic:
        return result(_static_slice(*_slice_plan(shape, starts, ends, axes, steps)), node, node.input_values[:1])
    inputs, literals = _slice_operands(node, graph)
    if any(isinstance(literal, int) for literal in literals):  # axes or steps computed by the graph
        return result(DynamicSlice(), node, node.input_values)
    return result(Inline(dynamic_slice, *literals), node, inputs)


# Gather -------------------------------------------------------------------------------------------
def gather(data: torch.Tensor, indices: torch.Tensor, axis: int, checked: tuple[str, str] | None) -> torch.Tensor:
    """ONNX Gather with a tensor of indices; with ``checked`` (the op and input to name in an error) they
    are read from data: checked against the axis, negative ones counting from the end."""
    if checked is not None:
        indices = wrapped_indices(indices, data.shape[axis], *checked)
    if axis == 0 and data.dim() == 2 and indices.dim() > 0:
        return F.embedding(indices, data)
    picked = data.index_select(axis, indices.reshape(-1))
    return picked.reshape(data.shape[:axis] + indices.shape + data.shape[axis + 1 :])


def select_one(x: torch.Tensor, axis: int, index: int) -> torch.Tensor:
    """``x.select(axis, index)``; in a compiled graph picked by ``index_select``, whose gradient adds into
    zeros where select's scatters into a view of them (inductor checks that view for overlap with a
    guard that the leading size is not 1: a graph of its own for batch 1). The same values either way."""
    if not torch.compiler.is_compiling():
        return x.select(axis, index)
    picked = x.index_select(axis, torch.tensor([index], device=x.device))
    return picked.reshape(x.shape[:axis] + x.shape[axis + 1 :])


@register("Gather", since=1)
def gather_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    shape = input_shape(node, graph, 0)
    axis = normalize_axis(attributes(node).get("axis", 0), len(shape))
    if not is_constant(node, graph, 1):
        return result(Inline(gather, axis, index_source(node, 1)), node)
    indices = constant_input(node, graph, 1)
    size = shape[axis]
    check_range(indices, -size, size, *index_source(node, 1))
    flat = [int(i) % size for i in indices.reshape(-1).tolist()]
    if indices.dim() == 0:
        return result(Inline(select_one, axis, flat[0]), node, node.input_values[:1])
    if indices.dim() == 1 and flat and flat == list(range(flat[0], flat[0] + len(flat))):
        return result(Inline("narrow", axis, flat[0], len(flat)), node, node.input_values[:1])
    return result(Inline(gather, axis, index_source(node, 1) if bool((indices < 0).any()) else None), node)


# Split --------------------------------------------------------------------------------------------
def _equal_split(size: int, parts: int) -> list[int]:
    """Split-18's num_outputs rule: chunks of ceil(size / parts), the last one smaller."""
    chunk = math.ceil(size / parts)
    return [min(chunk, max(size - chunk * i, 0)) for i in range(parts)]


def split_dynamic(x: torch.Tensor, split: torch.Tensor, axis: int) -> tuple[torch.Tensor, ...]:
    """Split with sizes known only at run time."""
    return torch.split(x, sizes_of(split), axis)


@register("Split", since=1, shape_inputs=(1,))
def split(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    shape = input_shape(node, graph, 0)
    axis = normalize_axis(attrs.get("axis", 0), len(shape))
    if context.opset < 13:
        sizes = attrs.get("split")
    else:
        sizes = constant_ints(node, graph, 1)
        if sizes is None and has_input(node, 1):
            return result(Inline(split_dynamic, axis), node)
    if sizes is None:
        parts = attrs.get("num_outputs", len(node.output_values))
        sizes = _equal_split(shape[axis], parts)
    if sum(sizes) != shape[axis]:
        raise ValueError(f"Split: sizes {sizes} do not add up to the axis size {shape[axis]}")
    return result(Inline(torch.split, list(sizes), axis), node, node.input_values[:1])


# Concat / Where -----------------------------------------------------------------------------------
def concat(*tensors: torch.Tensor, axis: int) -> torch.Tensor:
    """``torch.cat`` over positional inputs."""
    return torch.cat(tensors, axis)


@register("Concat", since=1)
def concat_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = max(len(input_shape(node, graph, position)) for position in range(len(node.input_values)))
    axis = normalize_axis(attributes(node).get("axis", 1 if context.opset < 4 else 0), rank)
    return result(Inline(concat, axis=axis), node)


def concat_with_lengths(*tensors: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """com.microsoft ConcatTraining: the concatenation and each input's length along ``axis``."""
    lengths = torch.tensor([t.shape[axis] for t in tensors], dtype=torch.int64, device=tensors[0].device)
    return torch.cat(tensors, axis), lengths


@register("ConcatTraining", domain=MICROSOFT)
def concat_training(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = max(len(input_shape(node, graph, position)) for position in range(len(node.input_values)))
    axis = normalize_axis(attributes(node).get("axis", 0), rank)
    if len(node.output_values) == 1:
        return result(Inline(concat, axis=axis), node)
    return result(Inline(concat_with_lengths, axis=axis), node)


@register("Where", since=9)
def where(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(torch.where), node)


def gather_elements(x: torch.Tensor, indices: torch.Tensor, axis: int, source: tuple[str, str]) -> torch.Tensor:
    """ONNX GatherElements: negative indices count from the end of ``axis``."""
    return torch.gather(x, axis, wrapped_indices(indices, x.shape[axis], *source))


@register("GatherElements", since=11)
def gather_elements_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    axis = normalize_axis(attributes(node).get("axis", 0), len(input_shape(node, graph, 0)))
    return result(Inline(gather_elements, axis, index_source(node, 1)), node)


# GatherND -----------------------------------------------------------------------------------------
def gather_nd(data: torch.Tensor, indices: torch.Tensor, batch_dims: int, source: tuple[str, str]) -> torch.Tensor:
    """ONNX GatherND: each index tuple (the last axis of ``indices``) picks a slice of ``data``, per batch."""
    batch = math.prod(data.shape[:batch_dims])
    depth = indices.shape[-1]
    flat = data.reshape(batch, *data.shape[batch_dims:])
    indices = wrapped_indices(indices, data.shape[batch_dims : batch_dims + depth], *source)
    picks = indices.reshape(batch, -1, depth)
    # the columns split off (batch, picks, 1), not selected: inductor lowers a selected column of a
    # strided tensor through a view that guards each size against 1, so batch 1 would compile again
    rows = torch.arange(batch, device=data.device).reshape(batch, 1, 1)
    index = (rows, *picks.split(1, -1))
    gathered = flat[index]
    return gathered.reshape(*indices.shape[:-1], *data.shape[batch_dims + depth :])


@register("GatherND", since=11)
def gather_nd_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(gather_nd, attributes(node).get("batch_dims", 0), index_source(node, 1)), node)
