"""Quantisation: QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv (integer sums exact in float64)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ort_torch_train.dtypes import torch_dtype

from .common import Inline, OperationConverterResult, attributes, input_shape, normalize_axis, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _along(parameter: torch.Tensor, x: torch.Tensor, axis: int, block: int) -> torch.Tensor:
    """A scale or zero point broadcastable against ``x``: per tensor, per ``axis``, or per block along it."""
    if parameter.dim() == 0 or (parameter.numel() == 1 and block == 0):
        return parameter.reshape(())
    if block:
        return parameter.repeat_interleave(block, dim=axis).narrow(axis, 0, x.shape[axis])
    shape = [1] * x.dim()
    shape[axis] = -1
    return parameter.reshape(shape)


def _saturate(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return values.round().clamp(info.min, info.max).to(dtype)


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    *,
    axis: int,
    block: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``saturate(round(x / scale) + zero_point)`` (round half to even)."""
    dtype = zero_point.dtype if zero_point is not None else dtype
    values = x / _along(scale, x, axis, block)
    if zero_point is not None:
        values = values.round() + _along(zero_point, x, axis, block).to(values.dtype)
    return _saturate(values, dtype)


def dequantize(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None, *, axis: int, block: int
) -> torch.Tensor:
    """``(x - zero_point) * scale`` in the scale's dtype."""
    values = x.to(torch.int32)
    if zero_point is not None:
        values = values - _along(zero_point, x, axis, block).to(torch.int32)
    return values.to(scale.dtype) * _along(scale, x, axis, block)


def _axis_block(node: OnnxNode, graph: OnnxGraph) -> tuple[int, int]:
    """The quantisation axis (unused, so not checked, for per-tensor parameters) and block size."""
    attrs = attributes(node)
    axis, rank = attrs.get("axis", 1), len(input_shape(node, graph, 0))
    return (normalize_axis(axis, rank) if -rank <= axis < rank else axis), attrs.get("block_size", 0)


@register("QuantizeLinear", since=10)
def quantize_linear(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    axis, block = _axis_block(node, graph)
    dtype = torch_dtype(attributes(node).get("output_dtype", 0) or 2)  # default uint8
    return result(Inline(quantize, axis=axis, block=block, dtype=dtype), node)


@register("DequantizeLinear", since=10)
def dequantize_linear(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    axis, block = _axis_block(node, graph)
    return result(Inline(dequantize, axis=axis, block=block), node)


def dynamic_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """uint8 quantisation of ``x`` over its range (with 0): values, scale, zero point."""
    high, low = x.max().clamp(min=0), x.min().clamp(max=0)
    scale = torch.where(high == low, torch.ones_like(high), high - low) / 255
    zero_point = (-low / scale).clamp(0, 255).round()
    return _saturate((x / scale).round() + zero_point, torch.uint8), scale.to(x.dtype), zero_point.to(torch.uint8)


@register("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(dynamic_quantize), node)


def _centred(x: torch.Tensor, zero_point: torch.Tensor | None, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """``x - zero_point`` in float64 (exact for 8/16-bit integers), the zero point reshaped to ``shape``."""
    values = x.to(torch.float64)
    if zero_point is None:
        return values
    zero_point = zero_point.to(torch.float64)
    return values - (zero_point.reshape(shape) if shape is not None and zero_point.numel() > 1 else zero_point)


def matmul_integer(
    a: torch.Tensor, b: torch.Tensor, a_zero_point: torch.Tensor | None = None, b_zero_point: torch.Tensor | None = None
) -> torch.Tensor:
    """int32 ``(a - a_zero_point) @ (b - b_zero_point)``; a per-row ``a_zero_point`` applies along rows."""
    return (_centred(a, a_zero_point, (-1, 1)) @ _centred(b, b_zero_point)).to(torch.int32)


@register("MatMulInteger", since=10)
def matmul_integer_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(matmul_integer), node)


def _requantize(values: torch.Tensor, multiplier: torch.Tensor, zero_point, like: torch.Tensor) -> torch.Tensor:
    values = values * multiplier.to(torch.float64)
    if zero_point is not None:
        values = values + zero_point.to(torch.float64)
    return _saturate(values, zero_point.dtype if zero_point is not None else like.dtype)


def qlinear_matmul(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    a_zero_point: torch.Tensor | None,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    b_zero_point: torch.Tensor | None,
    y_scale: torch.Tensor,
    y_zero_point: torch.Tensor | None = None,
) -> torch.Tensor:
    """Integer matmul of the centred operands, requantised by ``a_scale * b_scale / y_scale``."""
    product = _centred(a, a_zero_point) @ _centred(b, b_zero_point)
    return _requantize(product, a_scale * b_scale / y_scale, y_zero_point, a)


@register("QLinearMatMul", since=10)
def qlinear_matmul_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(qlinear_matmul), node)


class IntegerConv(torch.nn.Module):
    """Convolution of centred integer operands in float64 (ConvInteger; QLinearConv requantises it)."""

    def __init__(self, attrs: dict, rank: int) -> None:
        super().__init__()
        if attrs.get("auto_pad", "NOTSET") != "NOTSET":
            raise NotImplementedError(f"attribute auto_pad={attrs['auto_pad']!r} is not supported for integer convs")
        pads = list(attrs.get("pads", [0] * (2 * rank)))
        self.pads = [p for b, e in zip(reversed(pads[:rank]), reversed(pads[rank:])) for p in (b, e)]
        self.strides, self.dilations = attrs.get("strides", [1] * rank), attrs.get("dilations", [1] * rank)
        self.group, self.rank = attrs.get("group", 1), rank

    def convolve(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        x_zero_point: torch.Tensor | None = None,
        w_zero_point: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = F.pad(_centred(x, x_zero_point), self.pads)
        w = _centred(w, w_zero_point, (-1,) + (1,) * (w.dim() - 1))
        return _CONV[self.rank](x, w, None, self.strides, 0, self.dilations, self.group)

    def forward(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        x_zero_point: torch.Tensor | None = None,
        w_zero_point: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.convolve(x, w, x_zero_point, w_zero_point).to(torch.int32)


class QLinearConv(IntegerConv):
    """QLinearConv: the integer conv (plus int32 bias) requantised by ``x_scale * w_scale / y_scale``."""

    def forward(  # type: ignore[override]  # ONNX QLinearConv: scales and zero points between the operands
        self,
        x: torch.Tensor,
        x_scale: torch.Tensor,
        x_zero_point: torch.Tensor | None,
        w: torch.Tensor,
        w_scale: torch.Tensor,
        w_zero_point: torch.Tensor | None,
        y_scale: torch.Tensor,
        y_zero_point: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        values = self.convolve(x, w, x_zero_point, w_zero_point)
        if bias is not None:
            values = values + bias.to(torch.float64).reshape(-1, *[1] * self.rank)
        multiplier = x_scale * w_scale.reshape(-1, *[1] * self.rank) / y_scale
        return _requantize(values, multiplier, y_zero_point, x)


@register("ConvInteger", since=10)
def conv_integer(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(IntegerConv(attributes(node), len(input_shape(node, graph, 0)) - 2), node)


@register("QLinearConv", since=10)
def qlinear_conv(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(QLinearConv(attributes(node), len(input_shape(node, graph, 0)) - 2), node)
