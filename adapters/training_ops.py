"""ai.onnx.preview.training optimizers as functional updates: Adagrad, Momentum (standard, Nesterov), Adam."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .common import Inline, OperationConverterResult, attributes, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

TRAINING = "ai.onnx.preview.training"


def _groups(tensors: tuple, count: int) -> list[tuple]:
    """``(X1..Xn, G1..Gn, ...)`` -> ``[(X1, G1, ...), ...]``."""
    n = len(tensors) // count
    return [tuple(tensors[i + k * n] for k in range(count)) for i in range(n)]


def _flatten(updates: list[tuple]) -> tuple:
    """``[(X1', V1'), (X2', V2')]`` -> ``(X1', X2', V1', V2')``, ONNX's output order."""
    return tuple(update[k] for k in range(len(updates[0])) for update in updates)


def adagrad(
    r: torch.Tensor,
    t: torch.Tensor,
    *tensors: torch.Tensor,
    decay_factor: float,
    epsilon: float,
    norm_coefficient: float,
) -> tuple:
    rate = r / (1 + t * decay_factor)
    updates = []
    for x, g, h in _groups(tensors, 3):
        g = norm_coefficient * x + g
        h_new = h + g * g
        updates.append(((x - rate * g / (h_new.sqrt() + epsilon)).to(x.dtype), h_new.to(h.dtype)))
    return _flatten(updates)


def momentum(
    r: torch.Tensor,
    t: torch.Tensor,
    *tensors: torch.Tensor,
    alpha: float,
    beta: float,
    nesterov: bool,
    norm_coefficient: float,
) -> tuple:
    beta_now = torch.where(t > 0, beta, 1.0)
    updates = []
    for x, g, v in _groups(tensors, 3):
        g = norm_coefficient * x + g
        v_new = alpha * v + beta_now * g
        x_new = x - r * (g + alpha * v_new) if nesterov else x - r * v_new
        updates.append((x_new.to(x.dtype), v_new.to(v.dtype)))
    return _flatten(updates)


def adam(
    r: torch.Tensor,
    t: torch.Tensor,
    *tensors: torch.Tensor,
    alpha: float,
    beta: float,
    epsilon: float,
    norm_coefficient: float,
    norm_coefficient_post: float,
) -> tuple:
    steps = torch.where(t > 0, t, 1).to(torch.float64)  # no 0/0 at step 0: its NaN would reach R's gradient
    corrected = r * torch.sqrt(1 - beta**steps) / (1 - alpha**steps)
    rate = torch.where(t > 0, corrected.to(r.dtype), r)
    updates = []
    for x, g, v, h in _groups(tensors, 4):
        g = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g
        h_new = beta * h + (1 - beta) * (g * g)
        x_new = (1 - norm_coefficient_post) * (x - rate * (v_new / (h_new.sqrt() + epsilon)))
        updates.append((x_new.to(x.dtype), v_new.to(v.dtype), h_new.to(h.dtype)))
    return _flatten(updates)


@register("Adagrad", domain=TRAINING)
def adagrad_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(
        Inline(
            adagrad,
            decay_factor=attrs.get("decay_factor", 0.0),
            epsilon=attrs.get("epsilon", 0.0),
            norm_coefficient=attrs.get("norm_coefficient", 0.0),
        ),
        node,
    )


@register("Momentum", domain=TRAINING)
def momentum_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(
        Inline(
            momentum,
            alpha=attrs["alpha"],
            beta=attrs["beta"],
            nesterov=attrs["mode"] == "nesterov",
            norm_coefficient=attrs["norm_coefficient"],
        ),
        node,
    )


@register("Adam", domain=TRAINING)
def adam_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(
        Inline(
            adam,
            alpha=attrs.get("alpha", 0.9),
            beta=attrs.get("beta", 0.999),
            epsilon=attrs.get("epsilon", 0.0),
            norm_coefficient=attrs.get("norm_coefficient", 0.0),
            norm_coefficient_post=attrs.get("norm_coefficient_post", 0.0),
        ),
        node,
    )
