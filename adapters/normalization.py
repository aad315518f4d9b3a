"""BatchNormalization (training and inference), LayerNormalization and its ORT variants."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import OperationConverterResult, attributes, is_constant, result
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


class BatchNorm(nn.Module):
    """ONNX BatchNormalization. With ``batch_statistics`` it normalises with the batch's own statistics
    and, when ``update_running`` (running stats are parameters, not constants), updates them in place
    as ORT does: ``running = momentum * running + (1 - momentum) * batch`` with the biased variance.
    """

    def __init__(
        self, epsilon: float, momentum: float, batch_statistics: bool, update_running: bool, outputs: int
    ) -> None:
        super().__init__()
        self.epsilon, self.momentum = epsilon, momentum
        self.batch_statistics, self.update_running = batch_statistics, update_running
        self.outputs = outputs
        self._is_impure = update_running  # keep the node even if its output were unused

    def forward(
        self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if not self.batch_statistics:
            y = F.batch_norm(x, mean, var, scale, bias, training=False, eps=self.epsilon)
            return y if self.outputs == 1 else (y, mean, var)
        y = F.batch_norm(x, None, None, scale, bias, training=True, eps=self.epsilon)
        if self.update_running or self.outputs > 1:
            with torch.no_grad():
                dims = [d for d in range(x.dim()) if d != 1]
                batch_var, batch_mean = torch.var_mean(x.detach(), dim=dims, correction=0)
                new_mean = mean * self.momentum + batch_mean * (1 - self.momentum)
                new_var = var * self.momentum + batch_var * (1 - self.momentum)
                if self.update_running:
                    mean.copy_(new_mean)
                    var.copy_(new_var)
            if self.outputs > 1:
                inv_std = torch.rsqrt(batch_var + self.epsilon)
                return (y, new_mean, new_var, batch_mean, inv_std)[: self.outputs]
        return y


def _batch_norm(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    if attrs.get("spatial", 1) != 1:
        raise NotImplementedError("BatchNormalization with spatial=0 is not supported")
    running_are_params = not (is_constant(node, graph, 3) and is_constant(node, graph, 4))
    module = BatchNorm(
        epsilon=attrs.get("epsilon", 1e-5),
        momentum=attrs.get("momentum", 0.9),
        batch_statistics=context.training or bool(attrs.get("training_mode", 0)),
        update_running=context.training and running_are_params,
        outputs=len(node.output_values),
    )
    return result(module, node)


register("BatchNormalization", since=1, writes_inputs=(3, 4))(_batch_norm)
register("BatchNormInternal", domain=MICROSOFT, writes_inputs=(3, 4))(_batch_norm)


class LayerNorm(nn.Module):
    """ONNX LayerNormalization over dims ``axis..``; optionally also returns Mean and InvStdDev."""

    def __init__(self, axis: int, epsilon: float, outputs: int, simplified: bool = False) -> None:
        super().__init__()
        self.axis, self.epsilon, self.outputs, self.simplified = axis, epsilon, outputs, simplified

    def forward(
        self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        axis = self.axis % x.dim()
        dims = tuple(range(axis, x.dim()))
        if self.simplified:
            inv_std = torch.rsqrt(x.float().pow(2).mean(dim=dims, keepdim=True) + self.epsilon)
            y = (x.float() * inv_std).to(x.dtype) * scale
            return y if self.outputs == 1 else (y, inv_std)
        if scale.shape == x.shape[axis:] and (bias is None or bias.shape == scale.shape):
            y = F.layer_norm(x, x.shape[axis:], scale, bias, self.epsilon)
        else:
            var, mean = torch.var_mean(x, dim=dims, keepdim=True, correction=0)
            y = (x - mean) * torch.rsqrt(var + self.epsilon) * scale
            y = y if bias is None else y + bias
        if self.outputs == 1:
            return y
        var, mean = torch.var_mean(x.detach(), dim=dims, keepdim=True, correction=0)
        return (y, mean, torch.rsqrt(var + self.epsilon))[: self.outputs]


def _layer_norm(node: OnnxNode, graph: OnnxGraph, context: ConversionContext, simplified: bool = False):
    attrs = attributes(node)
    module = LayerNorm(attrs.get("axis", -1), attrs.get("epsilon", 1e-5), len(node.output_values), simplified)
    return result(module, node)


register("LayerNormalization", since=1)(_layer_norm)
register("LayerNormalization", domain=MICROSOFT)(_layer_norm)


@register("SimplifiedLayerNormalization", since=1)
@register("SimplifiedLayerNormalization", domain=MICROSOFT)
def simplified_layer_norm(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return _layer_norm(node, graph, context, simplified=True)


class SkipLayerNorm(nn.Module):
    """com.microsoft SkipLayerNormalization: LayerNorm(input + skip + bias); returns the sum as 4th output.
    ``simplified`` (SkipSimplifiedLayerNormalization): RMS normalisation, no beta, no mean (output 2 empty)."""

    def __init__(self, epsilon: float, outputs: int, simplified: bool = False) -> None:
        super().__init__()
        self.norm = LayerNorm(-1, epsilon, 2 if simplified else 3, simplified)
        self.outputs, self.simplified = outputs, simplified

    def forward(
        self,
        x: torch.Tensor,
        skip: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.simplified:  # inputs: input, skip, gamma, bias
            beta, bias = None, beta
        total = x + skip if bias is None else x + skip + bias
        if self.simplified:
            y, inv_std = self.norm(total, gamma)
            mean = torch.zeros((), dtype=inv_std.dtype, device=inv_std.device)
        else:
            y, mean, inv_std = self.norm(total, gamma, beta)
        return y if self.outputs == 1 else (y, mean, inv_std, total)[: self.outputs]


@register("SkipLayerNormalization", domain=MICROSOFT)
def skip_layer_norm(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(SkipLayerNorm(attributes(node).get("epsilon", 1e-5), len(node.output_values)), node)


@register("SkipSimplifiedLayerNormalization", domain=MICROSOFT)
def skip_simplified_layer_norm(
    node: OnnxNode, graph: OnnxGraph, context: ConversionContext
) -> OperationConverterResult:
    module = SkipLayerNorm(attributes(node).get("epsilon", 1e-5), len(node.output_values), simplified=True)
    return result(module, node)
