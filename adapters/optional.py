"""Optional values where they are plain tensors: OptionalHasElement, OptionalGetElement (optional-typed
values themselves have no torch form)."""

from __future__ import annotations

import torch

from .common import Inline, result
from .registry import ConversionContext, register


def has_element(x: torch.Tensor | None = None) -> torch.Tensor:
    """Whether the (tensor) input is present."""
    return torch.tensor(x is not None)


@register("OptionalHasElement", since=15)
def optional_has_element(node, graph, context: ConversionContext):
    return result(Inline(has_element), node)


def get_element(x: torch.Tensor) -> torch.Tensor:
    """The (tensor) input itself."""
    return x


@register("OptionalGetElement", since=15)
def optional_get_element(node, graph, context: ConversionContext):
    return result(Inline(get_element), node)
