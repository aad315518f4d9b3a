"""Arithmetic, Min/Max and comparisons on uint16/uint32/uint64, which torch's CPU kernels lack.

The converted op runs on int64: uint16/uint32 widen exactly; uint64 is reinterpreted bit for bit,
which wraps Add/Sub/Mul exactly and, with the sign bit flipped, orders values as unsigned. Div and
Mod of uint64 values at or above 2**63 are out of reach (they would divide negative numbers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .common import input_dtype
from .registry import wrap_converters

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)
_SIGN_BIT = -(2**63)
_ORDERED = ("Max", "Min", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")
_ARITHMETIC = ("Add", "Sub", "Mul", "Div", "Mod", "Equal")


class OnSigned(nn.Module):
    """Runs ``inner`` on int64 views of unsigned operands and casts numbers back to ``dtype``."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype, ordered: bool) -> None:
        super().__init__()
        self.inner, self.dtype, self.ordered = inner, dtype, ordered
        self.flip = ordered and dtype == torch.uint64

    def _signed(self, x):
        if not isinstance(x, torch.Tensor) or x.dtype != self.dtype:
            return x
        x = x.view(torch.int64) if self.dtype == torch.uint64 else x.to(torch.int64)
        return x ^ _SIGN_BIT if self.flip else x

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.inner(*(self._signed(x) for x in inputs))
        if out.dtype == torch.bool:
            return out
        if self.flip:
            out = out ^ _SIGN_BIT
        return out.view(self.dtype) if self.dtype == torch.uint64 else out.to(self.dtype)


def _on_signed(op_type: str):
    def wrapper(convert):
        def converted(node: OnnxNode, graph: OnnxGraph, context):
            converted_result = convert(node, graph, context)
            dtype = input_dtype(node, graph, 0)
            if dtype not in _UNSIGNED:
                return converted_result
            module = OnSigned(converted_result.torch_module, dtype, op_type in _ORDERED)
            return converted_result._replace(torch_module=module)

        return converted

    return wrapper


for _op_type in (*_ORDERED, *_ARITHMETIC):
    wrap_converters(_op_type, _on_signed(_op_type))
