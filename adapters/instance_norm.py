"""InstanceNormalization, LpNormalization and MeanVarianceNormalization."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .common import Inline, OperationConverterResult, attributes, input_shape, normalize_axis, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def instance_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, epsilon: float) -> torch.Tensor:
    return F.instance_norm(x, weight=scale, bias=bias, eps=epsilon)


@register("InstanceNormalization", since=1)
def instance_norm_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(instance_norm, attributes(node).get("epsilon", 1e-5)), node)


def lp_norm(x: torch.Tensor, axis: int, p: int) -> torch.Tensor:
    norm = torch.linalg.vector_norm(x, ord=p, dim=axis, keepdim=True)
    return torch.where(norm == 0, torch.zeros_like(x), x / norm)


@register("LpNormalization", since=1)
def lp_norm_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    axis = normalize_axis(attrs.get("axis", -1), len(input_shape(node, graph, 0)))
    return result(Inline(lp_norm, axis, attrs.get("p", 2)), node)


def mean_variance_norm(x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    variance, mean = torch.var_mean(x, dim=axes, keepdim=True, correction=0)
    return (x - mean) / (torch.sqrt(variance) + 1e-9)


@register("MeanVarianceNormalization", since=9)
def mean_variance_norm_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    rank = len(input_shape(node, graph, 0))
    axes = tuple(normalize_axis(a, rank) for a in attributes(node).get("axes", [0, 2, 3]))
    return result(Inline(mean_variance_norm, axes), node)
