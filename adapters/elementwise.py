"""Elementwise ops: arithmetic, unary math and activations, comparisons, logic, variadic Min/Max/Sum/Mean, Clip.

Each becomes one torch call. A one-element constant operand that does not widen the result is baked
in as a Python number (``torch.mul(x, 0.125)``), so no constant tensor is read at run time.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    has_input,
    input_dtype,
    input_shape,
    result,
    scalar_constant,
)
from .registry import ConversionContext, register
from .shape_ops import identity

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def _bakeable_scalar(node: OnnxNode, graph: OnnxGraph, position: int) -> float | int | bool | None:
    """Input ``position`` as a Python number if it is a one-element constant that broadcasting
    cannot widen (its rank is at most the other operand's)."""
    value = scalar_constant(node, graph, position)
    other = 1 - position
    if value is None or len(input_shape(node, graph, position)) > len(input_shape(node, graph, other)):
        return None
    return value


def _binary(node: OnnxNode, graph: OnnxGraph, function, reflected=None) -> object:
    """``function(a, b)`` with a scalar constant baked in; ``reflected(b, a)`` computes ``function(a, b)``."""
    second = _bakeable_scalar(node, graph, 1)
    if second is not None:
        return result(Inline(function, second), node, node.input_values[:1])
    first = _bakeable_scalar(node, graph, 0) if reflected is not None else None
    if first is not None:
        return result(Inline(reflected, first), node, node.input_values[1:2])
    return result(Inline(function), node)


# Arithmetic ---------------------------------------------------------------------------------------
@register("Add", since=1)
def add(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return _binary(node, graph, torch.add, torch.add)


@register("Sub", since=1)
def sub(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return _binary(node, graph, torch.sub, torch.rsub)


@register("Mul", since=1)
def mul(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return _binary(node, graph, torch.mul, torch.mul)


def truncating_div(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    """Integer division rounding toward zero, as ONNX Div does for integers.

    A zero divisor (undefined in ONNX) divides by 1 instead of raising: the conversion loop runs
    every node once on all-zero example inputs.
    """
    if isinstance(b, torch.Tensor):
        b = torch.where(b == 0, 1, b)
    return torch.div(a, b, rounding_mode="trunc")


@register("Div", since=1)
def div(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    if input_dtype(node, graph, 0).is_floating_point:
        return _binary(node, graph, torch.div, "__rtruediv__")
    return _binary(node, graph, truncating_div)


def pow_keep_dtype(base: torch.Tensor, exponent: torch.Tensor | float | int) -> torch.Tensor:
    """``base ** exponent`` in ``base``'s dtype (ONNX Pow's output type is the base's)."""
    return torch.pow(base, exponent).to(base.dtype)


@register("Pow", since=1)
def pow_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    exponent_dtype = input_dtype(node, graph, 1)
    base_dtype = input_dtype(node, graph, 0)
    same_result = base_dtype.is_floating_point or not exponent_dtype.is_floating_point
    return _binary(node, graph, torch.pow if same_result else pow_keep_dtype)


# Unary math and activations -----------------------------------------------------------------------
_UNARY = {
    "Neg": torch.neg,
    "Abs": torch.abs,
    "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal,
    "Exp": torch.exp,
    "Log": torch.log,
    "Erf": torch.erf,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "Relu": torch.relu,
    "Floor": torch.floor,
    "Ceil": torch.ceil,
    "Round": torch.round,
    "Sign": torch.sign,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Softplus": F.softplus,
    "Softsign": F.softsign,
    "Mish": F.mish,
    "Not": torch.logical_not,
    "IsNaN": torch.isnan,
}


def _direct(function):
    """A converter emitting ``function(*inputs)``."""

    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        return result(Inline(function), node)

    return convert


for _op_type, _function in _UNARY.items():
    register(_op_type, since=1)(_direct(_function))


@register("LeakyRelu", since=1)
def leaky_relu(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(F.leaky_relu, attributes(node).get("alpha", 0.01)), node)


@register("Elu", since=1)
def elu(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(F.elu, attributes(node).get("alpha", 1.0)), node)


def is_inf(x: torch.Tensor, negative: bool, positive: bool) -> torch.Tensor:
    """ONNX IsInf: which infinities count is chosen by detect_negative / detect_positive."""
    if negative and positive:
        return torch.isinf(x)
    if negative or positive:
        return torch.isneginf(x) if negative else torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


@register("IsInf", since=10)
def is_inf_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(Inline(is_inf, bool(attrs.get("detect_negative", 1)), bool(attrs.get("detect_positive", 1))), node)


# Comparisons and logic ----------------------------------------------------------------------------
_COMPARISONS = {  # op: (function, function with the operands swapped)
    "Equal": (torch.eq, torch.eq),
    "Less": (torch.lt, torch.gt),
    "Greater": (torch.gt, torch.lt),
    "LessOrEqual": (torch.le, torch.ge),
    "GreaterOrEqual": (torch.ge, torch.le),
}


def _comparison(function, swapped):
    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        return _binary(node, graph, function, swapped)

    return convert


for _op_type, (_function, _swapped) in _COMPARISONS.items():
    register(_op_type, since=1)(_comparison(_function, _swapped))

for _op_type, _function in {"And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor}.items():
    register(_op_type, since=1)(_direct(_function))


# Variadic -----------------------------------------------------------------------------------------
def maximum_of(*tensors: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of any number of broadcastable tensors."""
    return functools.reduce(torch.maximum, tensors)


def minimum_of(*tensors: torch.Tensor) -> torch.Tensor:
    """Elementwise minimum of any number of broadcastable tensors."""
    return functools.reduce(torch.minimum, tensors)


def sum_of(*tensors: torch.Tensor) -> torch.Tensor:
    """Elementwise sum of any number of broadcastable tensors."""
    return functools.reduce(torch.add, tensors)


def mean_of(*tensors: torch.Tensor) -> torch.Tensor:
    """Elementwise mean of any number of broadcastable tensors."""
    return functools.reduce(torch.add, tensors) / len(tensors)


_VARIADIC = {  # op: (any number of inputs, two inputs)
    "Max": (maximum_of, torch.maximum),
    "Min": (minimum_of, torch.minimum),
    "Sum": (sum_of, torch.add),
    "Mean": (mean_of, None),
}


def _variadic(function, pairwise):
    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        if len(node.input_values) == 2 and pairwise is not None:
            return result(Inline(pairwise), node)
        return result(Inline(function), node)

    return convert


for _op_type, (_function, _pairwise) in _VARIADIC.items():
    register(_op_type, since=1)(_variadic(_function, _pairwise))


# Clip ---------------------------------------------------------------------------------------------
class DynamicClip(nn.Module):
    """Clip with bounds read at run time."""

    def forward(
        self, x: torch.Tensor, min: torch.Tensor | None = None, max: torch.Tensor | None = None
    ) -> torch.Tensor:  # noqa: A002  (ONNX's names)
        return torch.clamp(x, min, max)


@register("Clip", since=1)
def clip(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    if context.opset < 11:
        attrs = attributes(node)
        low, high = attrs.get("min"), attrs.get("max")
    else:
        bounds = [position for position in (1, 2) if has_input(node, position)]
        constants = {position: scalar_constant(node, graph, position) for position in bounds}
        if any(value is None for value in constants.values()):
            return result(DynamicClip(), node)
        low, high = constants.get(1), constants.get(2)
    if low is None and high is None:
        return result(Inline(identity), node, node.input_values[:1])
    return result(Inline(torch.clamp, low, high), node, node.input_values[:1])
