"""Gemm and MatMul as single torch calls (F.linear / torch.addmm / torch.matmul); com.microsoft FusedGemm (a Gemm
and its activation, as ORT's optimizers fuse them in ORT-format models) as the same call and the activation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .common import Inline, OperationConverterResult, attributes, has_input, input_shape, result
from .registry import MICROSOFT, ConversionContext, register

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


GEMM_FORMS: dict[str, Callable[..., torch.Tensor]] = {
    "linear": F.linear,
    "gemm_without_c": gemm_without_c,
    "gemm": gemm,
}


def gemm_form(node: OnnxNode, graph: OnnxGraph, onnx_opset: int) -> tuple[str, dict, list[str]]:
    """How a Gemm (or FusedGemm) node runs: the name of a ``GEMM_FORMS`` function, its keyword arguments and
    the node inputs it takes; ``onnx_opset`` is the Gemm's ONNX opset (before 7 a C broadcasts only if asked)."""
    attrs = attributes(node)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    if onnx_opset < 7 and attrs.get("broadcast", 0) == 0 and has_input(node, 2):
        rows = input_shape(node, graph, 0)[1 if trans_a else 0]
        columns = input_shape(node, graph, 1)[0 if trans_b else 1]
        if tuple(input_shape(node, graph, 2)) != (rows, columns):
            raise NotImplementedError("Gemm: broadcast=0 with a C of another shape than the result is not supported")
    with_c = has_input(node, 2) and beta != 0.0
    if not with_c and not trans_a and trans_b and alpha == 1.0:
        return "linear", {}, list(node.input_values[:2])
    if not with_c:
        return "gemm_without_c", {"alpha": alpha, "trans_a": trans_a, "trans_b": trans_b}, list(node.input_values[:2])
    linear_form = not trans_a and trans_b and alpha == 1.0
    if linear_form and beta == 1.0 and input_shape(node, graph, 2) == input_shape(node, graph, 1)[:1]:
        return "linear", {}, list(node.input_values[:3])
    return "gemm", {"alpha": alpha, "beta": beta, "trans_a": trans_a, "trans_b": trans_b}, list(node.input_values[:3])


@register("Gemm", since=1)
def gemm_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    form, kwargs, inputs = gemm_form(node, graph, context.opset)
    return result(Inline(GEMM_FORMS[form], **kwargs), node, inputs)


def _hard_sigmoid(x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    return torch.clamp(x * alpha + beta, 0.0, 1.0)


# ORT's FusedGemm activations (its Gemm+activation fusion): name -> (function of x, alpha, beta; default alpha, beta)
FUSED_ACTIVATIONS: dict[str, tuple[Callable[[torch.Tensor, float, float], torch.Tensor], float, float]] = {
    "Relu": (lambda x, alpha, beta: torch.relu(x), 0.0, 0.0),
    "Tanh": (lambda x, alpha, beta: torch.tanh(x), 0.0, 0.0),
    "Sigmoid": (lambda x, alpha, beta: torch.sigmoid(x), 0.0, 0.0),
    "LeakyRelu": (lambda x, alpha, beta: F.leaky_relu(x, alpha), 0.01, 0.0),
    "Elu": (lambda x, alpha, beta: F.elu(x, alpha), 1.0, 0.0),
    "HardSigmoid": (_hard_sigmoid, 0.2, 0.5),
}


def fused_gemm(
    *inputs: torch.Tensor,
    form: str,
    activation: str,
    activation_alpha: float,
    activation_beta: float,
    **kwargs: float | bool,
) -> torch.Tensor:
    """com.microsoft FusedGemm: the Gemm ``form`` of ``inputs``, then ``activation``."""
    function = FUSED_ACTIVATIONS[activation][0]
    return function(GEMM_FORMS[form](*inputs, **kwargs), activation_alpha, activation_beta)


@register("FusedGemm", domain=MICROSOFT)
def fused_gemm_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    activation = attrs.get("activation", "")
    activation = activation.decode() if isinstance(activation, bytes) else str(activation)
    if activation not in FUSED_ACTIVATIONS:
        raise NotImplementedError(
            f"FusedGemm with activation {activation!r} is not supported; supported: {', '.join(FUSED_ACTIVATIONS)}"
        )
    _, alpha, beta = FUSED_ACTIVATIONS[activation]
    form, kwargs, inputs = gemm_form(node, graph, onnx_opset=13)  # ORT fuses the Gemm of opsets 7 to 13
    fused = {
        "form": form,
        "activation": activation,
        "activation_alpha": float(attrs.get("activation_alpha", alpha)),
        "activation_beta": float(attrs.get("activation_beta", beta)),
    }
    return result(Inline(fused_gemm, **fused, **kwargs), node, inputs)


@register("MatMul", since=1)
def matmul(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(torch.matmul), node)
