"""Value-producing and type ops: Constant, ConstantOfShape, Range, Cast, CastLike.

Constant, and ConstantOfShape/Range of constant inputs, are folded by the conversion loop; the
modules here compute them once (and at run time only when their inputs are not constant).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import onnx
import torch
from torch import nn

from ort_torch_train.dtypes import tensor_from_proto, torch_dtype

from .common import Inline, OperationConverterResult, attributes, input_dtype, result, sizes_of
from .registry import ConversionContext, register
from .size_limits import check_output_size

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


class ConstantValue(nn.Module):
    """Returns a fixed tensor."""

    value: torch.Tensor

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("value", value)

    def forward(self) -> torch.Tensor:
        return self.value


def _constant_tensor(node: OnnxNode) -> torch.Tensor:
    present = [attribute for attribute in node.proto.attribute]
    if len(present) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {[a.name for a in present]}")
    attribute = present[0]
    value = onnx.helper.get_attribute_value(attribute)
    if attribute.name == "value":
        return tensor_from_proto(value)
    if attribute.name == "value_float":
        return torch.tensor(value, dtype=torch.float32)
    if attribute.name == "value_floats":
        return torch.tensor(list(value), dtype=torch.float32)
    if attribute.name == "value_int":
        return torch.tensor(value, dtype=torch.int64)
    if attribute.name == "value_ints":
        return torch.tensor(list(value), dtype=torch.int64)
    raise NotImplementedError(f"Constant: attribute {attribute.name!r} is not supported (no torch equivalent)")


@register("Constant", since=1)
def constant(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(ConstantValue(_constant_tensor(node)), node)


def constant_of_shape(shape: torch.Tensor | list, value: float | int | bool, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` (an int64 tensor, or sizes a compiled graph computed) filled with ``value``."""
    dims = sizes_of(shape)
    check_output_size("ConstantOfShape", dims, dtype)
    return torch.full(dims, value, dtype=dtype)


@register("ConstantOfShape", since=9, shape_inputs=(0,))
def constant_of_shape_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    value = attributes(node).get("value")
    fill = tensor_from_proto(value.proto) if value is not None else torch.zeros(1, dtype=torch.float32)
    if fill.numel() != 1:
        raise ValueError(f"ConstantOfShape: value must hold one element, got {fill.numel()}")
    return result(Inline(constant_of_shape, fill.reshape(-1)[0].item(), fill.dtype), node)


def range_of(start: torch.Tensor, limit: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """ONNX Range: ``start + i * delta`` for ``i < max(ceil((limit - start) / delta), 0)``."""
    first, last, step = start.item(), limit.item(), delta.item()
    if (last - first) * step <= 0:  # torch.arange rejects an empty range given this way
        return torch.empty(0, dtype=start.dtype)
    check_output_size("Range", [math.ceil((last - first) / step)], start.dtype)
    return torch.arange(first, last, step, dtype=start.dtype)


@register("Range", since=11, shape_inputs=(0, 1, 2))
def range_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(range_of), node)


@register("Cast", since=1)
def cast(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    to = attributes(node)["to"]
    if isinstance(to, str):  # opset 1-5 spells the type name
        to = onnx.TensorProto.DataType.Value(to.upper())
    try:
        dtype = torch_dtype(to)
    except TypeError:
        raise NotImplementedError(f"Cast: attribute to={onnx.TensorProto.DataType.Name(to)} is not supported") from None
    return result(Inline("to", dtype), node)


@register("CastLike", since=15)
def cast_like(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline("to", input_dtype(node, graph, 1)), node, node.input_values[:1])
