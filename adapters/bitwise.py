"""Bitwise ops: BitShift, BitwiseAnd/Or/Xor/Not (unsigned operands run on int64 views), BitCast."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ort_torch_train.dtypes import torch_dtype

from .common import Inline, OperationConverterResult, attributes, input_dtype, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_WIDEN = {torch.uint16: torch.int64, torch.uint32: torch.int64, torch.uint64: torch.int64}


def _as_signed(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.uint64:
        return x.view(torch.int64)
    return x.to(_WIDEN[x.dtype]) if x.dtype in _WIDEN else x


def _back(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return out.view(dtype) if dtype == torch.uint64 else out.to(dtype)


def bit_shift(x: torch.Tensor, y: torch.Tensor, left: bool) -> torch.Tensor:
    a, b = _as_signed(x), _as_signed(y)
    if left:
        return _back(a << b, x.dtype)
    if x.dtype == torch.uint64:  # logical shift of the bit pattern
        shifted = (a >> b) & ~(((torch.ones_like(a) << 63) >> b) << 1)
        return _back(shifted, x.dtype)
    return _back(a >> b, x.dtype)


def bitwise(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(*inputs: torch.Tensor) -> torch.Tensor:
        return _back(function(*(_as_signed(x) for x in inputs)), inputs[0].dtype)

    return run


@register("BitShift", since=11)
def bit_shift_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    direction = attributes(node)["direction"]
    direction = direction.decode() if isinstance(direction, bytes) else direction
    return result(Inline(bit_shift, left=direction == "LEFT"), node)


_BITWISE = {
    "BitwiseAnd": torch.bitwise_and,
    "BitwiseOr": torch.bitwise_or,
    "BitwiseXor": torch.bitwise_xor,
    "BitwiseNot": torch.bitwise_not,
}


def _bitwise_converter(function):
    wrapped = bitwise(function)

    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        direct = input_dtype(node, graph, 0) not in _WIDEN
        return result(Inline(function if direct else wrapped), node)

    return convert


for _op_type, _function in _BITWISE.items():
    register(_op_type, since=18)(_bitwise_converter(_function))


def bit_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The same bits read as ``dtype`` (of the same width), in ``x``'s shape, rank 0 included.

    A function, not a ``view`` method call: the view-chain pass folds ``view`` calls as reshapes."""
    return x.view(dtype).reshape(x.shape)


@register("BitCast", since=26)
def bit_cast_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(bit_cast, torch_dtype(attributes(node)["to"])), node)
