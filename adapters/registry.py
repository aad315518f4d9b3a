"""The project's converter registry, consulted before onnx2torch's.

A converter has onnx2torch's shape plus a context:
``fn(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult``.
``graph`` holds the node's constant inputs as initializers and every input's concrete
``value_info``, so a converter may bake constants in and read shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch
from torch import fx

MICROSOFT = "com.microsoft"


SubgraphConverter = Callable[[onnx.GraphProto, Sequence[torch.Tensor]], fx.GraphModule]
"""``(graph attribute, example inputs) -> module``: a subgraph converted as the graph holding it is."""


@dataclass(frozen=True)
class ConversionContext:
    """What a converter may need beyond the node: the semantics and opset of the graph (``opsets``:
    every domain's) and, for a node holding a graph attribute, how to convert it."""

    training: bool
    opset: int
    opsets: Mapping[str, int] = field(default_factory=dict)
    convert_subgraph: SubgraphConverter | None = None


Converter = Callable[[Any, Any, ConversionContext], Any]

_REGISTRY: dict[tuple[str, str], list[tuple[int, Converter]]] = {}


def register(op_type: str, *, domain: str = "", since: int = 1) -> Callable[[Converter], Converter]:
    """Register ``fn`` for ``domain::op_type`` at opset versions ``>= since``."""

    def decorate(fn: Converter) -> Converter:
        entries = _REGISTRY.setdefault((domain, op_type), [])
        if any(version == since for version, _ in entries):
            raise ValueError(f"converter for {domain or 'ai.onnx'}::{op_type} since {since} already registered")
        entries.append((since, fn))
        entries.sort(key=lambda entry: -entry[0])
        return fn

    return decorate


def find_converter(domain: str, op_type: str, opset: int) -> Converter | None:
    """The project's converter for ``op_type`` at ``opset``, or None."""
    entries = _REGISTRY.get((normalize_domain(domain), op_type), ())
    for since, fn in entries:
        if since <= opset:
            return fn
    return None


def normalize_domain(domain: str) -> str:
    """``domain`` with ``ai.onnx`` spelled as the default domain ``""``."""
    return "" if domain == "ai.onnx" else domain


def schema_version(domain: str, op_type: str, opset: int) -> int | None:
    """The ``since_version`` of the ONNX schema in force at ``opset``, or None if unknown."""
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=normalize_domain(domain)).since_version
    except Exception:
        return None


def wrap_converters(op_type: str, wrapper: Callable[[Converter], Converter], *, domain: str = "") -> None:
    """Replace every registered converter ``fn`` of ``domain::op_type`` by ``wrapper(fn)``."""
    entries = _REGISTRY.get((domain, op_type), [])
    entries[:] = [(since, wrapper(fn)) for since, fn in entries]
