"""Sampling grids and image blocks: GridSample, AffineGrid, Col2Im, DeformConv, RoiAlign."""

from __future__ import annotations

import math
from types import EllipsisType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .common import Inline, OperationConverterResult, attributes, input_shape, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_GRID_MODES = {
    "linear": "bilinear",
    "bilinear": "bilinear",
    "nearest": "nearest",
    "cubic": "bicubic",
    "bicubic": "bicubic",
}


@register("GridSample", since=16)
def grid_sample(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    mode = _GRID_MODES[attrs.get("mode", "linear" if context.opset >= 20 else "bilinear")]
    return result(
        Inline(
            F.grid_sample,
            mode=mode,
            padding_mode=attrs.get("padding_mode", "zeros"),
            align_corners=bool(attrs.get("align_corners", 0)),
        ),
        node,
    )


def affine_grid(theta: torch.Tensor, size: torch.Tensor, align_corners: bool) -> torch.Tensor:
    """F.affine_grid for the output size held by ``size`` (read at run time)."""
    return F.affine_grid(theta, [int(v) for v in size.tolist()], align_corners=align_corners)


@register("AffineGrid", since=20, shape_inputs=(1,))
def affine_grid_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(affine_grid, bool(attributes(node).get("align_corners", 0))), node)


def col2im(
    x: torch.Tensor,
    image_shape: torch.Tensor,
    block_shape: torch.Tensor,
    dilations: list[int] | None,
    pads: list[int] | None,
    strides: list[int] | None,
) -> torch.Tensor:
    """ONNX Col2Im for any number of spatial dims: each column's block added back at its image position."""
    image, block = [int(v) for v in image_shape.tolist()], [int(v) for v in block_shape.tolist()]
    rank = len(image)
    dilations, strides = dilations or [1] * rank, strides or [1] * rank
    pads = pads or [0] * (2 * rank)
    padded = [n + pads[i] + pads[i + rank] for i, n in enumerate(image)]
    counts = [(p - (d * (k - 1) + 1)) // s + 1 for p, k, d, s in zip(padded, block, dilations, strides)]
    index = _block_positions(padded, block, dilations, strides, counts, x.device)
    batch, channels = x.shape[0], x.shape[1] // math.prod(block)
    out = x.new_zeros(batch, channels, math.prod(padded))
    out = out.index_add(2, index, x.reshape(batch, channels, -1))
    out = out.reshape(batch, channels, *padded)
    inside: tuple[EllipsisType | slice, ...] = (Ellipsis, *(slice(pads[i], pads[i] + n) for i, n in enumerate(image)))
    return out[inside]


def _block_positions(padded, block, dilations, strides, counts, device) -> torch.Tensor:
    """Flat padded-image index of every (block offset..., block position...) pair, in Col2Im's column order."""
    grids = torch.meshgrid(
        *[torch.arange(k, device=device) for k in block],
        *[torch.arange(c, device=device) for c in counts],
        indexing="ij",
    )
    rank = len(block)
    flat = torch.zeros_like(grids[0])
    for axis in range(rank):
        coordinate = grids[axis] * dilations[axis] + grids[rank + axis] * strides[axis]
        flat = flat * padded[axis] + coordinate
    return flat.reshape(-1)


@register("Col2Im", since=18, shape_inputs=(1, 2))
def col2im_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(Inline(col2im, attrs.get("dilations"), attrs.get("pads"), attrs.get("strides")), node)


class DeformConv(torch.nn.Module):
    """2-D DeformConv: each kernel tap samples the input bilinearly at its offset position (grid_sample,
    zeros outside), weighted by the optional mask, then a (grouped) convolution sum."""

    def __init__(self, attrs: dict, kernel: tuple[int, ...]) -> None:
        super().__init__()
        self.kernel = tuple(attrs.get("kernel_shape", kernel))
        self.strides, self.dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
        self.pads = attrs.get("pads", [0, 0, 0, 0])
        self.group, self.offset_group = attrs.get("group", 1), attrs.get("offset_group", 1)

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        offset: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        n, channels, height, width = x.shape
        kh, kw = self.kernel
        out_h, out_w = offset.shape[2:]
        groups = self.offset_group
        offset = offset.reshape(n, groups, kh, kw, 2, out_h, out_w)
        rows = (torch.arange(kh, device=x.device) * self.dilations[0]).reshape(kh, 1, 1, 1) + (
            torch.arange(out_h, device=x.device) * self.strides[0] - self.pads[0]
        ).reshape(1, 1, out_h, 1)
        columns = (torch.arange(kw, device=x.device) * self.dilations[1]).reshape(1, kw, 1, 1) + (
            torch.arange(out_w, device=x.device) * self.strides[1] - self.pads[1]
        ).reshape(1, 1, 1, out_w)
        y = (rows + offset[:, :, :, :, 0]) / (height - 1) * 2 - 1  # [n, groups, kh, kw, out_h, out_w]
        x_coordinate = (columns + offset[:, :, :, :, 1]) / (width - 1) * 2 - 1
        grid = torch.stack((x_coordinate, y), dim=-1).to(x.dtype).reshape(n * groups, kh * kw * out_h, out_w, 2)
        per_group = x.reshape(n * groups, channels // groups, height, width)
        taps = F.grid_sample(per_group, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
        taps = taps.reshape(n, groups, channels // groups, kh, kw, out_h, out_w)
        if mask is not None:
            taps = taps * mask.reshape(n, groups, 1, kh, kw, out_h, out_w)
        taps = taps.reshape(n, self.group, channels // self.group, kh, kw, out_h, out_w)
        kernels = weight.reshape(self.group, weight.shape[0] // self.group, *weight.shape[1:])
        out = torch.einsum("ngcklij,gockl->ngoij", taps, kernels).reshape(n, weight.shape[0], out_h, out_w)
        return out if bias is None else out + bias.reshape(1, -1, 1, 1)


@register("DeformConv", since=19)
def deform_conv(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = len(input_shape(node, graph, 0)) - 2
    if rank != 2:
        raise NotImplementedError(f"DeformConv with {rank} spatial dimensions is not supported (2 are)")
    return result(DeformConv(attributes(node), input_shape(node, graph, 1)[2:]), node)


def _roi_axis(start: float, bins: float, pooled: int, grid: int, size: int, device):
    """Per sample along one axis (``pooled * grid``): low/high indices, low/high weights and validity."""
    steps = torch.arange(pooled, dtype=torch.float64).reshape(-1, 1) * bins
    position = (start + steps + (torch.arange(grid, dtype=torch.float64) + 0.5) * bins / grid).reshape(-1)
    valid = (position >= -1.0) & (position <= size)
    position = position.clamp(min=0)
    low = position.floor().long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, low, low + 1)
    position = torch.where(at_edge, low.double(), position)
    fraction = position - low
    return low.to(device), high.to(device), (1 - fraction).to(device), fraction.to(device), valid.to(device)


def roi_align(
    x: torch.Tensor,
    rois: torch.Tensor,
    batch_indices: torch.Tensor,
    *,
    pooled: tuple[int, int],
    ratio: int,
    scale: float,
    half_pixel: bool,
    average: bool,
) -> torch.Tensor:
    """ONNX RoiAlign: bilinear samples on a ``ratio`` (or adaptive) grid per bin, averaged or max-pooled
    (max over the four weighted corners, as ONNX/ORT define it)."""
    offset = 0.5 if half_pixel else 0.0
    height, width = x.shape[2:]
    outputs = []
    for box, batch in zip(rois.tolist(), batch_indices.tolist()):
        start_w, start_h, end_w, end_h = (v * scale - offset for v in box)
        roi_w, roi_h = end_w - start_w, end_h - start_h
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / pooled[0], roi_w / pooled[1]
        grid_h = ratio if ratio > 0 else math.ceil(roi_h / pooled[0])
        grid_w = ratio if ratio > 0 else math.ceil(roi_w / pooled[1])
        y_low, y_high, hy, ly, valid_y = _roi_axis(start_h, bin_h, pooled[0], grid_h, height, x.device)
        x_low, x_high, hx, lx, valid_x = _roi_axis(start_w, bin_w, pooled[1], grid_w, width, x.device)
        feature = x[int(batch)]
        corners = [
            feature[:, rows][:, :, columns] * (wy.reshape(-1, 1) * wx.reshape(1, -1)).to(x.dtype)
            for rows, wy in ((y_low, hy), (y_high, ly))
            for columns, wx in ((x_low, hx), (x_high, lx))
        ]
        valid = (valid_y.reshape(-1, 1) & valid_x.reshape(1, -1)).to(x.dtype)
        samples = (sum(corners) if average else torch.stack(corners).amax(0)) * valid
        samples = samples.reshape(x.shape[1], pooled[0], grid_h, pooled[1], grid_w)
        outputs.append(samples.sum((2, 4)) / max(grid_h * grid_w, 1) if average else samples.amax((2, 4)))
    return torch.stack(outputs) if outputs else x.new_zeros(0, x.shape[1], *pooled)


@register("RoiAlign", since=10)
def roi_align_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    half_pixel = (
        attrs.get("coordinate_transformation_mode", "half_pixel" if context.opset >= 16 else "output_half_pixel")
        == "half_pixel"
    )
    return result(
        Inline(
            roi_align,
            pooled=(attrs.get("output_height", 1), attrs.get("output_width", 1)),
            ratio=attrs.get("sampling_ratio", 0),
            scale=attrs.get("spatial_scale", 1.0),
            half_pixel=half_pixel,
            average=attrs.get("mode", "avg") == "avg",
        ),
        node,
    )
