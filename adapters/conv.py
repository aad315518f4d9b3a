"""Conv and ConvTranspose with weights given as inputs (functional, so parameters stay outside)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import OperationConverterResult, attributes, compiling_ahead, input_shape, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
# Below this many multiply-adds a 2-D conv runs as a sum over its kernel taps when compiled (torch.compile
# or a package's ahead-of-time program):
# inductor fuses that into one loop, while oneDNN's per-call setup dominates tiny convs (docs/performance.md).
# Each tap adds its own nodes to the compiled graph (forward and backward), so kernels of more taps than a
# 3x3 stay with the conv kernel: compile time grows with the taps.
_DIRECT_MAX_MACS = 1_000_000
_DIRECT_MAX_TAPS = 9
_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _same_pads(auto_pad: str, sizes, kernel, strides, dilations) -> list[int]:
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


class Conv(nn.Module):
    """ONNX Conv: x, w[, b] with static attributes."""

    def __init__(
        self,
        rank: int,
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        groups: int,
        direct: bool = False,
    ) -> None:
        super().__init__()
        self.conv = _CONV[rank]
        self.direct = direct  # a sum over kernel taps when compiled (see _DIRECT_MAX_MACS)
        self.strides, self.dilations, self.groups = tuple(strides), tuple(dilations), groups
        begins, ends = pads[:rank], pads[rank:]
        self.symmetric = begins == ends
        self.padding = tuple(begins) if self.symmetric else (0,) * rank
        # F.pad wants (last_begin, last_end, ..., first_begin, first_end)
        self.pad = [p for b, e in zip(reversed(begins), reversed(ends)) for p in (b, e)]

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.direct and compiling_ahead():
            padded = F.pad(x, self.pad) if any(self.pad) else x
            return _conv2d_as_taps(padded, weight, bias, self.strides, self.dilations)
        if not self.symmetric:
            x = F.pad(x, self.pad)
        return self.conv(x, weight, bias, self.strides, self.padding, self.dilations, self.groups)


def _conv2d_as_taps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, strides, dilations):
    """A 2-D conv with one group on a padded input, as a sum over the kernel's taps of strided windows."""
    _, _, kernel_h, kernel_w = weight.shape
    (stride_h, stride_w), (dilation_h, dilation_w) = strides, dilations
    out_h = (x.shape[2] - (kernel_h - 1) * dilation_h - 1) // stride_h + 1
    out_w = (x.shape[3] - (kernel_w - 1) * dilation_w - 1) // stride_w + 1
    out: torch.Tensor | None = None
    for i in range(kernel_h):
        for j in range(kernel_w):
            top, left = i * dilation_h, j * dilation_w
            window = x[
                :,
                None,
                :,
                top : top + (out_h - 1) * stride_h + 1 : stride_h,
                left : left + (out_w - 1) * stride_w + 1 : stride_w,
            ]  # N, 1, C, H', W'
            tap = (window * weight[None, :, :, i, j, None, None]).sum(2)
            out = tap if out is None else out + tap
    if out is None:
        raise ValueError("a convolution kernel without taps")
    return out if bias is None else out + bias[None, :, None, None]


class ConvTranspose(nn.Module):
    """ONNX ConvTranspose: x, w[, b]; asymmetric pads and output_shape by cropping a full result."""

    def __init__(
        self,
        rank: int,
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        groups: int,
        output_padding: Sequence[int],
    ) -> None:
        super().__init__()
        self.conv = _CONV_TRANSPOSE[rank]
        self.rank = rank
        self.strides, self.dilations, self.groups = tuple(strides), tuple(dilations), groups
        self.begins, self.ends = list(pads[:rank]), list(pads[rank:])
        self.output_padding = tuple(output_padding)
        self.symmetric = self.begins == self.ends and all(
            p < max(s, d) for p, s, d in zip(output_padding, strides, dilations)
        )

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.symmetric:
            return self.conv(
                x, weight, bias, self.strides, tuple(self.begins), self.output_padding, self.groups, self.dilations
            )
        full = self.conv(x, weight, None, self.strides, 0, 0, self.groups, self.dilations)
        extend = [p for extra in reversed(self.output_padding) for p in (0, extra)]
        full = F.pad(full, extend)
        index = [slice(None), slice(None)] + [
            slice(b, full.shape[2 + i] - e) for i, (b, e) in enumerate(zip(self.begins, self.ends))
        ]
        out = full[tuple(index)]
        if bias is not None:
            out = out + bias.reshape(1, -1, *([1] * self.rank))
        return out


def _common(node: OnnxNode, graph: OnnxGraph):
    attrs = attributes(node)
    weight_shape = input_shape(node, graph, 1)
    rank = len(weight_shape) - 2
    if rank not in _CONV:
        raise NotImplementedError(f"{node.operation_type} with {rank} spatial dimensions is not supported")
    kernel = attrs.get("kernel_shape", list(weight_shape[2:]))
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    return attrs, rank, kernel, strides, dilations


@register("Conv", since=1)
def conv(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs, rank, kernel, strides, dilations = _common(node, graph)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto_pad, input_shape(node, graph, 0)[2:], kernel, strides, dilations)
    else:
        pads = [0] * (2 * rank) if auto_pad == "VALID" else attrs.get("pads", [0] * (2 * rank))
    groups = attrs.get("group", 1)
    direct = (
        rank == 2
        and groups == 1
        and math.prod(kernel) <= _DIRECT_MAX_TAPS
        and _multiply_adds(node, graph, pads, kernel, strides, dilations) <= _DIRECT_MAX_MACS
    )
    return result(Conv(rank, strides, pads, dilations, groups, direct), node)


def _multiply_adds(node: OnnxNode, graph: OnnxGraph, pads, kernel, strides, dilations) -> int:
    batch, channels, *sizes = input_shape(node, graph, 0)
    out_channels = input_shape(node, graph, 1)[0]
    total = batch * channels * out_channels
    for size, begin, end, k, s, d in zip(sizes, pads[: len(sizes)], pads[len(sizes) :], kernel, strides, dilations):
        total *= k * ((size + begin + end - (k - 1) * d - 1) // s + 1)
    return total


@register("ConvTranspose", since=1)
def conv_transpose(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs, rank, kernel, strides, dilations = _common(node, graph)
    output_padding = attrs.get("output_padding", [0] * rank)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    pads = attrs.get("pads", [0] * (2 * rank))
    sizes = input_shape(node, graph, 0)[2:]
    if "output_shape" in attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = attrs.get("output_shape") or [size * s for size, s in zip(sizes, strides)]
        wanted = list(wanted)[-rank:]
        totals = [
            s * (size - 1) + op + (k - 1) * d + 1 - out
            for size, s, op, k, d, out in zip(sizes, strides, output_padding, kernel, dilations, wanted)
        ]
        # a negative total (output_shape beyond the full result) extends the end, as output_padding does
        output_padding = [op + max(-t, 0) for op, t in zip(output_padding, totals)]
        totals = [max(t, 0) for t in totals]
        lower_first = auto_pad == "SAME_LOWER"
        begins = [t - t // 2 if lower_first else t // 2 for t in totals]
        pads = begins + [t - b for t, b in zip(totals, begins)]
    elif auto_pad == "VALID":
        pads = [0] * (2 * rank)
    return result(ConvTranspose(rank, strides, pads, dilations, attrs.get("group", 1), output_padding), node)
