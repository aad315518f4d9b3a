"""Gemm and MatMul as single torch calls (F.linear / torch.addmm / torch.matmul)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .common import Inline, OperationConverterResult, attributes, has_input, input_shape, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    alpha: float,
    beta: float,
    trans_a: bool,
    trans_b: bool,
) -> torch.Tensor:
    """``alpha * op(a) @ op(b) + beta * c`` with op an optional transpose; c broadcasts to the result."""
    a = a.t() if trans_a else a
    b = b.t() if trans_b else b
    if c is None:
        out = torch.mm(a, b)
        return out if alpha == 1.0 else out * alpha
    return torch.addmm(c, a, b, beta=beta, alpha=alpha)


def gemm_without_c(a: torch.Tensor, b: torch.Tensor, *, alpha: float, trans_a: bool, trans_b: bool) -> torch.Tensor:
    """Gemm whose C is absent (Inline results take no None inputs)."""
    return gemm(a, b, alpha=alpha, beta=0.0, trans_a=trans_a, trans_b=trans_b)


@register("Gemm", since=1)
def gemm_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    if context.opset < 7 and attrs.get("broadcast", 0) == 0 and has_input(node, 2):
        rows = input_shape(node, graph, 0)[1 if trans_a else 0]
        columns = input_shape(node, graph, 1)[0 if trans_b else 1]
        if tuple(input_shape(node, graph, 2)) != (rows, columns):
            raise NotImplementedError("Gemm: broadcast=0 with a C of another shape than the result is not supported")
    with_c = has_input(node, 2) and beta != 0.0
    if not with_c and not trans_a and trans_b and alpha == 1.0:
        return result(Inline(F.linear), node, node.input_values[:2])
    if not with_c:
        return result(
            Inline(gemm_without_c, alpha=alpha, trans_a=trans_a, trans_b=trans_b), node, node.input_values[:2]
        )
    linear_form = not trans_a and trans_b and alpha == 1.0
    if linear_form and beta == 1.0 and input_shape(node, graph, 2) == input_shape(node, graph, 1)[:1]:
        return result(Inline(F.linear), node, node.input_values[:3])
    return result(Inline(gemm, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b), node, node.input_values[:3])


@register("MatMul", since=1)
def matmul(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(torch.matmul), node)
