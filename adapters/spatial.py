"""Sampling grids and image blocks: GridSample, AffineGrid, Col2Im, DeformConv."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import Inline, attributes, input_shape, result
from .registry import ConversionContext, register

_GRID_MODES = {"linear": "bilinear", "bilinear": "bilinear", "nearest": "nearest", "cubic": "bicubic",
               "bicubic": "bicubic"}


@register("GridSample", since=16)
def grid_sample(node, graph, context: ConversionContext):
    attrs = attributes(node)
    mode = _GRID_MODES[attrs.get("mode", "linear" if context.opset >= 20 else "bilinear")]
    return result(Inline(F.grid_sample, mode=mode, padding_mode=attrs.get("padding_mode", "zeros"),
                         align_corners=bool(attrs.get("align_corners", 0))), node)


def affine_grid(theta: torch.Tensor, size: torch.Tensor, align_corners: bool) -> torch.Tensor:
    """F.affine_grid for the output size held by ``size`` (read at run time)."""
    return F.affine_grid(theta, [int(v) for v in size.tolist()], align_corners=align_corners)


@register("AffineGrid", since=20)
def affine_grid_op(node, graph, context: ConversionContext):
    return result(Inline(affine_grid, bool(attributes(node).get("align_corners", 0))), node)


def col2im(x: torch.Tensor, image_shape: torch.Tensor, block_shape: torch.Tensor,
           dilations: list[int] | None, pads: list[int] | None, strides: list[int] | None) -> torch.Tensor:
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
    return out[(Ellipsis, *(slice(pads[i], pads[i] + n) for i, n in enumerate(image)))]


def _block_positions(padded, block, dilations, strides, counts, device) -> torch.Tensor:
    """Flat padded-image index of every (block offset..., block position...) pair, in Col2Im's column order."""
    grids = torch.meshgrid(*[torch.arange(k, device=device) for k in block],
                           *[torch.arange(c, device=device) for c in counts], indexing="ij")
    rank = len(block)
    flat = torch.zeros_like(grids[0])
    for axis in range(rank):
        coordinate = grids[axis] * dilations[axis] + grids[rank + axis] * strides[axis]
        flat = flat * padded[axis] + coordinate
    return flat.reshape(-1)


@register("Col2Im", since=18)
def col2im_op(node, graph, context: ConversionContext):
    attrs = attributes(node)
    return result(Inline(col2im, attrs.get("dilations"), attrs.get("pads"), attrs.get("strides")), node)


class DeformConv(torch.nn.Module):
    """2-D DeformConv: each kernel tap samples the input bilinearly at its offset position (grid_sample,
    zeros outside), weighted by the optional mask, then a (grouped) convolution sum."""

    def __init__(self, attrs: dict, kernel: tuple[int, int]):
        super().__init__()
        self.kernel = tuple(attrs.get("kernel_shape", kernel))
        self.strides, self.dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
        self.pads = attrs.get("pads", [0, 0, 0, 0])
        self.group, self.offset_group = attrs.get("group", 1), attrs.get("offset_group", 1)

    def forward(self, x, weight, offset, bias=None, mask=None):
        n, channels, height, width = x.shape
        kh, kw = self.kernel
        out_h, out_w = offset.shape[2:]
        groups = self.offset_group
        offset = offset.reshape(n, groups, kh, kw, 2, out_h, out_w)
        rows = (torch.arange(kh, device=x.device) * self.dilations[0]).reshape(kh, 1, 1, 1) + \
            (torch.arange(out_h, device=x.device) * self.strides[0] - self.pads[0]).reshape(1, 1, out_h, 1)
        columns = (torch.arange(kw, device=x.device) * self.dilations[1]).reshape(1, kw, 1, 1) + \
            (torch.arange(out_w, device=x.device) * self.strides[1] - self.pads[1]).reshape(1, 1, 1, out_w)
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
def deform_conv(node, graph, context: ConversionContext):
    rank = len(input_shape(node, graph, 0)) - 2
    if rank != 2:
        raise NotImplementedError(f"DeformConv with {rank} spatial dimensions is not supported (2 are)")
    return result(DeformConv(attributes(node), input_shape(node, graph, 1)[2:]), node)
