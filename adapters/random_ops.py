"""Random draws with ONNX's attributes: RandomUniformLike, Bernoulli (torch's generator, not numpy's); the other
random ops, converted by onnx2torch or not at all, declared random."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ort_torch_train.dtypes import torch_dtype

from .common import OperationConverterResult, attributes, result
from .registry import ConversionContext, declare, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


class _Seeded(nn.Module):
    """Draws from torch's default generator, or from one seeded once by the ``seed`` attribute."""

    def __init__(self, dtype: torch.dtype | None, seed: float | None) -> None:
        super().__init__()
        self.dtype, self.seed = dtype, seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        if device not in self._generators:
            self._generators[device] = torch.Generator(device).manual_seed(int(self.seed))
        return self._generators[device]


class RandomUniformLike(_Seeded):
    """Uniform draws in ``[low, high)`` of the input's shape (dtype: the attribute's, else the input's)."""

    def __init__(self, dtype: torch.dtype | None, seed: float | None, low: float, high: float) -> None:
        super().__init__(dtype, seed)
        self.low, self.high = low, high

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        draw = torch.rand(x.shape, dtype=self.dtype or x.dtype, device=x.device, generator=self.generator(x.device))
        return draw * (self.high - self.low) + self.low


class Bernoulli(_Seeded):
    """One 0/1 draw per element with the input's probability (dtype: the attribute's, else the input's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bernoulli(x, generator=self.generator(x.device)).to(self.dtype or x.dtype)


def _dtype(attrs: dict) -> torch.dtype | None:
    return torch_dtype(attrs["dtype"]) if attrs.get("dtype") else None


@register("RandomUniformLike", since=1, random=True)
def random_uniform_like(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(
        RandomUniformLike(_dtype(attrs), attrs.get("seed"), attrs.get("low", 0.0), attrs.get("high", 1.0)), node
    )


@register("Bernoulli", since=15, random=True)
def bernoulli(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(Bernoulli(_dtype(attrs), attrs.get("seed")), node)


for _op_type in ("RandomNormal", "RandomNormalLike", "RandomUniform", "Multinomial"):
    declare(_op_type, random=True)
