"""Resize (opset 11-19; nearest, linear and cubic; half_pixel, half_pixel_symmetric, pytorch_half_pixel,
align_corners, asymmetric and tf_crop_and_resize coordinates; antialias; opset 18 axes and
keep_aspect_ratio_policy) and Upsample (opset 7-9). Cubic, antialiased and tf_crop_and_resize resizes run
as per-axis interpolation matrices (resize_matrix.py).

Bilinear-family half_pixel/align_corners and nearest/asymmetric/floor resizes run as
``F.interpolate``; everything else gathers with per-axis index and weight tables computed from the
concrete shapes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import (
    OperationConverterResult,
    attributes,
    constant_input,
    has_input,
    input_shape,
    is_constant,
    normalize_axis,
    result,
)
from .registry import ConversionContext, register
from .resize_matrix import MatrixResize

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
_NEAREST = {
    "round_prefer_floor": lambda x: math.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: math.floor(x + 0.5),
    "floor": math.floor,
    "ceil": math.ceil,
}
_INTERPOLATE_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _source_coordinate(x: int, size: int, out: int, scale: float, mode: str) -> float:
    """ONNX's coordinate_transformation_mode: output position -> input coordinate."""
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out / (scale * size)
        return size / 2 * (1 - adjustment) + (x + 0.5) / scale - 0.5
    width = scale * size  # ONNX's output width before flooring
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if width > 1 else 0.0
    if mode == "align_corners":
        return x * (size - 1) / (width - 1) if width != 1 else 0.0
    return x / scale


class TableResize(nn.Module):
    """Separable resize: per axis, gather one (nearest) or two (linear) source rows and blend."""

    def __init__(self, plan: dict[int, tuple[list[int], list[int], list[float] | None]]) -> None:
        super().__init__()
        self.axes = list(plan)
        for axis, (low, high, weights) in plan.items():
            self.register_buffer(f"low{axis}", torch.tensor(low), persistent=False)
            self.register_buffer(f"high{axis}", torch.tensor(high), persistent=False)
            if weights is not None:
                self.register_buffer(f"weight{axis}", torch.tensor(weights), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for axis in self.axes:
            low = x.index_select(axis, getattr(self, f"low{axis}"))
            weight = getattr(self, f"weight{axis}", None)
            if weight is None:
                x = low
                continue
            high = x.index_select(axis, getattr(self, f"high{axis}"))
            shape = [1] * x.dim()
            shape[axis] = -1
            weight = weight.to(x.dtype).reshape(shape)
            x = low + (high - low) * weight
        return x


def _axis_plan(size: int, out: int, scale: float, attrs: dict, linear: bool):
    coordinates = [_source_coordinate(x, size, out, scale, attrs["coordinate_transformation_mode"]) for x in range(out)]
    if not linear:
        pick = _NEAREST[attrs["nearest_mode"]]
        index = [min(max(pick(c), 0), size - 1) for c in coordinates]
        return index, index, None
    floors = [math.floor(c) for c in coordinates]
    low = [min(max(f, 0), size - 1) for f in floors]
    high = [min(max(f + 1, 0), size - 1) for f in floors]
    return low, high, [c - f for c, f in zip(coordinates, floors)]


def _targets(scale_values, size_values, shape, axes, attrs) -> tuple[list[float], list[int]]:
    """Per resized axis: the scale and the output size."""
    if size_values is not None:
        sizes = [int(v) for v in _numbers(size_values)]
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            return [out / shape[a] for out, a in zip(sizes, axes)], sizes
        pick = min if policy == "not_larger" else max
        scale = pick(out / shape[a] for out, a in zip(sizes, axes))
        return [scale] * len(axes), [math.floor(scale * shape[a] + 0.5) for a in axes]
    scales = [float(v) for v in _numbers(scale_values)]
    return scales, [math.floor(shape[a] * s) for a, s in zip(axes, scales)]


def _numbers(values: torch.Tensor | list) -> list:
    """A tensor's values, or a list the conversion read already."""
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


def _interpolate(scales, sizes, shape, axes, attrs, linear: bool):
    """An F.interpolate call equal to this resize, or None."""
    rank = len(shape)
    if axes != list(range(2, rank)) or rank - 2 not in _INTERPOLATE_MODES:
        return None
    coordinates = attrs["coordinate_transformation_mode"]
    same_size_scales = all(math.isclose(s, out / shape[a]) for s, out, a in zip(scales, sizes, axes))
    if linear and coordinates in ("half_pixel", "align_corners") and same_size_scales:
        mode = _INTERPOLATE_MODES[rank - 2]
        return InterpolateTo(tuple(sizes), mode, coordinates == "align_corners")
    if not linear and coordinates == "asymmetric" and attrs["nearest_mode"] == "floor" and same_size_scales:
        return InterpolateTo(tuple(sizes), "nearest", None)
    return None


class InterpolateTo(nn.Module):
    """``F.interpolate`` to a fixed size."""

    def __init__(self, size: tuple[int, ...], mode: str, align_corners: bool | None) -> None:
        super().__init__()
        self.size, self.mode, self.align_corners = size, mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, self.size, mode=self.mode, align_corners=self.align_corners)


@register("Resize", since=11, shape_inputs=(1, 2, 3))
def resize(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = dict(attributes(node))
    attrs.setdefault("coordinate_transformation_mode", "half_pixel")
    attrs.setdefault("nearest_mode", "round_prefer_floor")
    mode = attrs.get("mode", "nearest")
    coordinates = attrs["coordinate_transformation_mode"]
    if mode not in ("nearest", "linear", "cubic") or coordinates not in (*_COORDINATES, "tf_crop_and_resize"):
        raise NotImplementedError(
            f"Resize: mode={mode!r} with coordinate_transformation_mode={coordinates!r} is not supported"
        )
    shape = input_shape(node, graph, 0)
    axes = [normalize_axis(a, len(shape)) for a in attrs.get("axes", range(len(shape)))]
    target = 3 if has_input(node, 3) else 2
    if mode == "cubic" or coordinates == "tf_crop_and_resize" or attrs.get("antialias", 0):
        roi = node.input_values[1] if has_input(node, 1) else ""
        if is_constant(node, graph, target) and (not roi or is_constant(node, graph, 1)):
            # constant roi and scales/sizes are read here: traced as tensors they would be data-dependent
            bounds = constant_input(node, graph, 1).reshape(-1).tolist() if roi else []
            numbers = constant_input(node, graph, target).reshape(-1).tolist()
            module = MatrixResize(axes, attrs, target == 3, _targets, (bounds, numbers))
            return result(module, node, node.input_values[:1])
        return result(
            MatrixResize(axes, attrs, target == 3, _targets),
            node,
            [node.input_values[0], roi, node.input_values[target]],
        )
    if not is_constant(node, graph, target):
        return result(
            RuntimeResize(axes, attrs, sizes=target == 3), node, [node.input_values[0], node.input_values[target]]
        )
    values = constant_input(node, graph, target)
    return result(
        _static_resize(shape, axes, attrs, *((None, values) if target == 3 else (values, None))),
        node,
        node.input_values[:1],
    )


class RuntimeResize(nn.Module):
    """Resize to scales or sizes read at run time (the index tables are built on each call)."""

    def __init__(self, axes: list[int], attrs: dict, sizes: bool) -> None:
        super().__init__()
        self.axes, self.attrs, self.sizes = axes, attrs, sizes

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        values = (None, target) if self.sizes else (target, None)
        return _static_resize(tuple(x.shape), self.axes, self.attrs, *values).to(x.device)(x)


def _static_resize(shape, axes, attrs, scale_values, size_values) -> nn.Module:
    mode = attrs.get("mode", "nearest")
    scales, sizes = _targets(scale_values, size_values, shape, axes, attrs)
    kept = [i for i, (a, out) in enumerate(zip(axes, sizes)) if not (out == shape[a] and scales[i] == 1.0)]
    axes, scales, sizes = [axes[i] for i in kept], [scales[i] for i in kept], [sizes[i] for i in kept]
    linear = mode == "linear"
    module = _interpolate(scales, sizes, shape, axes, attrs, linear)
    if module is None:
        plan = {a: _axis_plan(shape[a], out, s, attrs, linear) for a, s, out in zip(axes, scales, sizes)}
        module = TableResize(plan)
    return module


@register("Upsample", since=7, shape_inputs=(1,))
def upsample(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    """Upsample (opset 7-9): a Resize by scales with asymmetric coordinates and floor nearest."""
    node_attrs = attributes(node)
    mode = "linear" if node_attrs.get("mode", "nearest") in ("linear", "bilinear") else "nearest"
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    shape = input_shape(node, graph, 0)
    axes = list(range(len(shape)))
    if "scales" in node_attrs or is_constant(node, graph, 1):
        scales = torch.tensor(node_attrs["scales"]) if "scales" in node_attrs else constant_input(node, graph, 1)
        return result(_static_resize(shape, axes, attrs, scales, None), node, node.input_values[:1])
    return result(RuntimeResize(axes, attrs, sizes=False), node)
