"""Pad (opset 2-21: constant, reflect, edge, wrap; pads as attribute or input; opset 18 axes input), CenterCropPad."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    constant_ints,
    has_input,
    input_shape,
    is_constant,
    normalize_axis,
    result,
    scalar_constant,
)
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_TORCH_MODES = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}


def _source_index(size: int, begin: int, end: int, mode: str) -> list[int]:
    """For each output position along one axis, the input position it copies (pads < 0 crop)."""
    positions = range(-begin, size + end)
    if mode == "edge":
        return [min(max(p, 0), size - 1) for p in positions]
    if mode == "wrap":
        return [p % size for p in positions]
    period = 2 * (size - 1) or 1  # reflect: mirror without repeating the edge
    return [(size - 1) - abs((size - 1) - p % period) if size > 1 else 0 for p in positions]


def pad_by_index(x: torch.Tensor, pads: dict[int, tuple[int, int]], mode: str) -> torch.Tensor:
    """Reflect/edge/wrap padding on any axes by gathering source positions."""
    for axis, (begin, end) in pads.items():
        index = torch.tensor(_source_index(x.shape[axis], begin, end, mode), device=x.device)
        x = x.index_select(axis, index)
    return x


def _torch_pad(rank: int, pads: dict[int, tuple[int, int]]) -> list[int]:
    """F.pad's list (last axis first) covering every axis from the first padded one on."""
    first = min(pads, default=rank)
    return [p for axis in reversed(range(first, rank)) for p in pads.get(axis, (0, 0))]


def pad_tensor(x: torch.Tensor, pads: dict[int, tuple[int, int]], mode: str, value: float | int) -> torch.Tensor:
    """ONNX Pad with pads given per axis as (begin, end)."""
    pads = {axis: pad for axis, pad in pads.items() if pad != (0, 0)}
    if mode == "constant":
        return F.pad(x, _torch_pad(x.dim(), pads), value=value) if pads else x
    spatial_only = x.dim() in (3, 4, 5) and all(axis >= 2 for axis in pads)
    if spatial_only and all(b >= 0 and e >= 0 for b, e in pads.values()) and x.shape[2:].numel() > 0:
        return F.pad(x, _torch_pad(x.dim(), pads), mode=_TORCH_MODES[mode])
    return pad_by_index(x, pads, mode)


def _per_axis(pads: list[int] | None, axes: list[int] | None, rank: int) -> dict[int, tuple[int, int]]:
    if pads is None or axes is None:
        raise ValueError("Pad: its pads and axes must be given as constants")
    count = len(axes)
    if len(pads) != 2 * count:
        raise ValueError(f"Pad: {len(pads)} pads for {count} axes")
    return {normalize_axis(axis, rank): (pads[i], pads[count + i]) for i, axis in enumerate(axes)}


class DynamicPad(nn.Module):
    """Pad whose pads, constant value or axes are read at run time."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(
        self,
        x: torch.Tensor,
        pads: torch.Tensor,
        constant_value: torch.Tensor | None = None,
        axes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        axis_list = list(range(x.dim())) if axes is None else axes.tolist()
        per_axis = _per_axis(pads.tolist(), axis_list, x.dim())
        if self.mode == "constant" and constant_value is not None and constant_value.requires_grad:
            outside = pad_tensor(torch.zeros_like(x), per_axis, "constant", 1) > 0  # the value's gradient
            return torch.where(outside, constant_value.reshape(()), pad_tensor(x, per_axis, "constant", 0))
        value = 0 if constant_value is None else constant_value.item()
        return pad_tensor(x, per_axis, self.mode, value)


@register("Pad", since=1, shape_inputs=(1, 2, 3))
def pad(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    mode = attrs.get("mode", "constant")
    if mode not in ("constant", *_TORCH_MODES):
        raise NotImplementedError(f"Pad: attribute mode={mode!r} is not supported")
    rank = len(input_shape(node, graph, 0))
    if context.opset < 11:
        pads = attrs.get("pads", attrs.get("paddings"))
        module = Inline(pad_tensor, _per_axis(pads, list(range(rank)), rank), mode, attrs.get("value", 0.0))
        return result(module, node)
    dynamic = any(has_input(node, position) and not is_constant(node, graph, position) for position in (1, 2, 3))
    if dynamic:
        return result(DynamicPad(mode), node)
    axes = constant_ints(node, graph, 3) if has_input(node, 3) else list(range(rank))
    value = scalar_constant(node, graph, 2) if has_input(node, 2) else 0
    per_axis = _per_axis(constant_ints(node, graph, 1), axes, rank)
    return result(Inline(pad_tensor, per_axis, mode, value), node, node.input_values[:1])


def center_crop_pad(x: torch.Tensor, shape: torch.Tensor, axes: list[int]) -> torch.Tensor:
    """ONNX CenterCropPad: each axis in ``axes`` centre-cropped or zero-padded to ``shape`` (read at run time)."""
    pads = [0] * (2 * x.dim())
    for axis, target in zip(axes, shape.tolist()):
        difference = int(target) - x.shape[axis]
        begin = difference // 2 if difference >= 0 else -((-difference) // 2)
        position = 2 * (x.dim() - 1 - axis)  # F.pad: last dim first
        pads[position], pads[position + 1] = begin, difference - begin
    return F.pad(x, pads)


@register("CenterCropPad", since=18, shape_inputs=(1,))
def center_crop_pad_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = len(input_shape(node, graph, 0))
    axes = [normalize_axis(a, rank) for a in attributes(node).get("axes", range(rank))]
    return result(Inline(center_crop_pad, axes), node)
