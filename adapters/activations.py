"""GELU in its ONNX (opset 20) and ORT contrib forms; the other pointwise activations and trigonometry."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import Inline, OperationConverterResult, attributes, result
from .elementwise import _direct as direct
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


class Gelu(nn.Module):
    """``gelu(x [+ bias])``, exact (erf) or tanh-approximated."""

    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.gelu(x if bias is None else x + bias, approximate=self.approximate)


@register("Gelu", since=20)
def gelu(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Gelu(attributes(node).get("approximate", "none")), node)


@register("Gelu", domain=MICROSOFT)
@register("BiasGelu", domain=MICROSOFT)
def ms_gelu(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Gelu("none"), node)


@register("FastGelu", domain=MICROSOFT)
def fast_gelu(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Gelu("tanh"), node)


class QuickGelu(nn.Module):
    """com.microsoft QuickGelu: ``x * sigmoid(alpha * x)``."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.alpha * x)


@register("QuickGelu", domain=MICROSOFT)
def quick_gelu(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(QuickGelu(attributes(node).get("alpha", 1.702)), node)


# Pointwise activations of opsets 6-22 ------------------------------------------------------------
def hard_sigmoid(x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    return torch.clamp(x * alpha + beta, 0.0, 1.0)


def selu(x: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


def swish(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * torch.sigmoid(alpha * x)


def thresholded_relu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.where(x > alpha, x, torch.zeros_like(x))


def shrink(x: torch.Tensor, bias: float, lambd: float) -> torch.Tensor:
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x))).to(x.dtype)


@register("HardSwish", since=14)
def hard_swish_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(F.hardswish), node)


@register("HardSigmoid", since=1)
def hard_sigmoid_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(Inline(hard_sigmoid, attrs.get("alpha", 0.2), attrs.get("beta", 0.5)), node)


@register("Selu", since=1)
def selu_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(
        Inline(selu, attrs.get("alpha", 1.67326319217681884765625), attrs.get("gamma", 1.05070102214813232421875)), node
    )


@register("Celu", since=12)
def celu_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(F.celu, attributes(node).get("alpha", 1.0)), node)


@register("Swish", since=24)
def swish_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(swish, attributes(node).get("alpha", 1.0)), node)


@register("ThresholdedRelu", since=10)
def thresholded_relu_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(thresholded_relu, attributes(node).get("alpha", 1.0)), node)


@register("Shrink", since=9)
def shrink_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(Inline(shrink, attrs.get("bias", 0.0), attrs.get("lambd", 0.5)), node)


_TRIGONOMETRY = {
    "Tan": torch.tan,
    "Asin": torch.asin,
    "Acos": torch.acos,
    "Atan": torch.atan,
    "Sinh": torch.sinh,
    "Cosh": torch.cosh,
    "Asinh": torch.asinh,
    "Acosh": torch.acosh,
    "Atanh": torch.atanh,
}


for _op_type, _function in _TRIGONOMETRY.items():
    register(_op_type, since=7)(direct(_function))


def swiglu(a: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    return a * torch.sigmoid(alpha * a) * b


@register("SwiGLU", since=28)
def swiglu_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(swiglu, attributes(node).get("alpha", 1.0)), node)
