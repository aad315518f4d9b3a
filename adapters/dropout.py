"""Dropout (with its mask output) and ORT's dropout variants, active only under training semantics."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import OperationConverterResult, attributes, compiling_ahead, constant_input, is_constant, result
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


class Dropout(nn.Module):
    """``y = x * mask / (1 - ratio)`` when active, ``y = x`` otherwise; returns ``(y, mask)`` when asked."""

    def __init__(self, active: bool, ratio: float | None, with_mask: bool, extra_outputs: int = 0) -> None:
        super().__init__()
        self.active, self.ratio, self.with_mask = active, ratio, with_mask
        self.extra_outputs = extra_outputs

    def forward(
        self, x: torch.Tensor, ratio: torch.Tensor | None = None, training_mode: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor | None, ...]:
        p = self.ratio if self.ratio is not None else (0.5 if ratio is None else float(ratio))
        if not self.active or p == 0.0:
            y, mask = x, (torch.ones_like(x, dtype=torch.bool) if self.with_mask else None)
        elif not self.with_mask and not compiling_ahead():
            y, mask = F.dropout(x, p, training=True), None
        else:  # traced (torch.compile, a package): F.dropout under torch.func.grad cannot trace a dynamic size
            mask = torch.rand_like(x, dtype=torch.float32) >= p
            y = x * mask / (1.0 - p) if p < 1.0 else torch.zeros_like(x)
            mask = mask if self.with_mask else None
        if not self.with_mask and not self.extra_outputs:
            return y
        return (y, mask) + (None,) * self.extra_outputs


def _ratio(node: OnnxNode, graph: OnnxGraph) -> float | None:
    attrs = attributes(node)
    if "ratio" in attrs:  # opset < 12
        return float(attrs["ratio"])
    if len(node.input_values) > 1 and node.input_values[1]:
        return float(constant_input(node, graph, 1)) if is_constant(node, graph, 1) else None
    return 0.5


def _active(node: OnnxNode, graph: OnnxGraph, context: ConversionContext, training_mode_position: int) -> bool:
    """Training semantics, unless the node pins training_mode to a constant False."""
    inputs = node.input_values
    if (
        training_mode_position < len(inputs)
        and inputs[training_mode_position]
        and is_constant(node, graph, training_mode_position)
    ):
        return context.training and bool(constant_input(node, graph, training_mode_position))
    return context.training


@register("Dropout", since=1, random=True)
def dropout(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    with_mask = len(node.output_values) > 1 and bool(node.output_values[1])
    module = Dropout(_active(node, graph, context, 2), _ratio(node, graph), with_mask)
    return result(module, node)


@register("BitmaskDropout", domain=MICROSOFT, random=True)
def bitmask_dropout(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    # The packed bitmask only feeds BitmaskDropoutGrad, which torch autograd replaces.
    module = Dropout(
        _active(node, graph, context, 2),
        _ratio(node, graph),
        with_mask=False,
        extra_outputs=len(node.output_values) - 1,
    )
    return result(module, node)


class BiasDropout(nn.Module):
    """com.microsoft BiasDropout: ``dropout(x + bias) + residual``."""

    def __init__(self, dropout_module: Dropout) -> None:
        super().__init__()
        self.dropout = dropout_module

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor,
        residual: torch.Tensor | None = None,
        ratio: torch.Tensor | None = None,
        training_mode: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor | None, ...]:
        out = self.dropout(x + bias, ratio)
        y, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
        y = y if residual is None else y + residual
        return (y, *rest) if rest else y


@register("BiasDropout", domain=MICROSOFT, random=True)
@register("BitmaskBiasDropout", domain=MICROSOFT, random=True)
def bias_dropout(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs_ratio = (
        float(constant_input(node, graph, 3))
        if is_constant(node, graph, 3)
        else (0.5 if len(node.input_values) <= 3 or not node.input_values[3] else None)
    )
    with_mask = node.operation_type == "BiasDropout" and len(node.output_values) > 1 and bool(node.output_values[1])
    extra = 0 if with_mask else len(node.output_values) - 1
    inner = Dropout(_active(node, graph, context, 4), attrs_ratio, with_mask, extra)
    return result(BiasDropout(inner), node)
