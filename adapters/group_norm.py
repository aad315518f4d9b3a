"""GroupNormalization (opset 18: per-group scale/bias; opset 21: per-channel) and RMSNormalization-23."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .common import Inline, OperationConverterResult, attributes, input_shape, normalize_axis, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def group_norm_per_group_affine(
    x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, groups: int, epsilon: float
) -> torch.Tensor:
    """Opset 18 GroupNormalization: scale and bias hold one value per group."""
    channels = x.shape[1]
    shape = (1, channels) + (1,) * (x.dim() - 2)
    per_channel_scale = scale.repeat_interleave(channels // groups).reshape(shape)
    per_channel_bias = bias.repeat_interleave(channels // groups).reshape(shape)
    return F.group_norm(x, groups, None, None, epsilon) * per_channel_scale + per_channel_bias


@register("GroupNormalization", since=18)
def group_norm(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    groups, epsilon = attrs["num_groups"], attrs.get("epsilon", 1e-5)
    channels = input_shape(node, graph, 0)[1]
    if input_shape(node, graph, 1) == (channels,):
        return result(Inline(group_norm_per_channel, groups, epsilon), node)
    return result(Inline(group_norm_per_group_affine, groups, epsilon), node)


def group_norm_per_channel(
    x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, groups: int, epsilon: float
) -> torch.Tensor:
    """Opset 21 GroupNormalization: torch's group_norm with per-channel scale and bias."""
    return F.group_norm(x, groups, scale, bias, epsilon)


def rms_norm(x: torch.Tensor, scale: torch.Tensor, axis: int, epsilon: float) -> torch.Tensor:
    """RMSNormalization over the dims from ``axis`` on, statistics in float32 for narrower inputs."""
    dims = tuple(range(axis, x.dim()))
    if scale.shape == x.shape[axis:]:
        return F.rms_norm(x, x.shape[axis:], scale, epsilon)
    stats = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    inv = torch.rsqrt(stats.pow(2).mean(dims, keepdim=True) + epsilon)
    return (stats * inv).to(x.dtype) * scale


@register("RMSNormalization", since=23)
def rms_normalization(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    axis = normalize_axis(attrs.get("axis", -1), len(input_shape(node, graph, 0)))
    return result(Inline(rms_norm, axis, attrs.get("epsilon", 1e-5)), node)
