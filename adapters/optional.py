"""Optional values where they are plain tensors: OptionalHasElement, OptionalGetElement (optional-typed
values themselves have no torch form)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .common import Inline, OperationConverterResult, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def has_element(x: torch.Tensor | None = None) -> torch.Tensor:
    """Whether the (tensor) input is present."""
    return torch.tensor(x is not None)


@register("OptionalHasElement", since=15)
def optional_has_element(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(has_element), node)


def get_element(x: torch.Tensor) -> torch.Tensor:
    """The (tensor) input itself."""
    return x


@register("OptionalGetElement", since=15)
def optional_get_element(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(get_element), node)
