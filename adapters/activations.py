"""GELU in its ONNX (opset 20) and ORT contrib forms."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import attributes, result
from .registry import MICROSOFT, ConversionContext, register


class Gelu(nn.Module):
    """``gelu(x [+ bias])``, exact (erf) or tanh-approximated."""

    def __init__(self, approximate: str):
        super().__init__()
        self.approximate = approximate

    def forward(self, x, bias=None):
        return F.gelu(x if bias is None else x + bias, approximate=self.approximate)


@register("Gelu", since=20)
def gelu(node, graph, context: ConversionContext):
    return result(Gelu(attributes(node).get("approximate", "none")), node)


@register("Gelu", domain=MICROSOFT)
@register("BiasGelu", domain=MICROSOFT)
def ms_gelu(node, graph, context: ConversionContext):
    return result(Gelu("none"), node)


@register("FastGelu", domain=MICROSOFT)
def fast_gelu(node, graph, context: ConversionContext):
    return result(Gelu("tanh"), node)


class QuickGelu(nn.Module):
    """com.microsoft QuickGelu: ``x * sigmoid(alpha * x)``."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return x * torch.sigmoid(self.alpha * x)


@register("QuickGelu", domain=MICROSOFT)
def quick_gelu(node, graph, context: ConversionContext):
    return result(QuickGelu(attributes(node).get("alpha", 1.702)), node)
