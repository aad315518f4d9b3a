"""Sampling grids and image blocks: GridSample, AffineGrid, Col2Im."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import Inline, attributes, result
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
