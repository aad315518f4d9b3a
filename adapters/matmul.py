"""ORT's fused matrix products: com.microsoft FusedMatMul."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .common import OperationConverterResult, attributes, result
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


class FusedMatMul(nn.Module):
    """``alpha * op(A) @ op(B)``, op transposing the last two dims when asked."""

    def __init__(self, alpha: float, trans_a: bool, trans_b: bool) -> None:
        super().__init__()
        self.alpha, self.trans_a, self.trans_b = alpha, trans_a, trans_b

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.trans_a:
            a = a.transpose(-1, -2)
        if self.trans_b:
            b = b.transpose(-1, -2)
        out = torch.matmul(a, b)
        return out if self.alpha == 1.0 else out * self.alpha


@register("FusedMatMul", domain=MICROSOFT)
def fused_matmul(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    if attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0):
        raise NotImplementedError("FusedMatMul with transBatchA/transBatchB is not supported")
    module = FusedMatMul(float(attrs.get("alpha", 1.0)), bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0)))
    return result(module, node)
