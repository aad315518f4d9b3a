"""The project's converter registry, consulted before onnx2torch's, and the operator facts the conversion
pass reads (``OpFacts``: given to ``register``, or to ``declare`` for an op converted elsewhere).

A converter has onnx2torch's shape plus a context:
``fn(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult``.
``graph`` holds the node's constant inputs as initializers and every input's concrete
``value_info``, so a converter may bake constants in and read shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class OpLibrary(Protocol):
    """Operators a session brings of its own (``Module(custom_ops=)``: a custom-op library registered
    through the C API), consulted before this registry for that session's graphs only."""

    def converter(self, domain: str, op_type: str) -> Converter | None:
        """The converter for ``domain::op_type``, or None when the library lacks the op."""
        ...

    def differentiable(self, domain: str, op_type: str) -> bool:
        """Whether gradients flow back through the library's ``domain::op_type``."""
        ...


@dataclass(frozen=True)
class OpFacts:
    """What the conversion pass must know about an operator beyond its converter.

    - ``random``: draws random numbers, so it is never folded into a constant.
    - ``shape_inputs``: positions of inputs whose values decide the output shapes; those shapes are
      static only where these inputs are constants.
    - ``data_dependent_shape``: the output shapes depend on input values whatever the constants.
    - ``writes_inputs``: positions of inputs that running the node updates in place (a training
      BatchNorm's running statistics).
    - ``control_flow``: runs subgraphs that input values choose or repeat (so its output shapes
      depend on values too).
    - ``quantized_inputs``: positions of integer inputs holding a quantised weight (packed values, zero
      points): the op computes floating-point values from them, and their values decide no shape and no
      element read, so the conversion's shape-only run takes them as it takes floats; the op's other integer
      inputs (indices) are read there as they are.
    """

    random: bool = False
    shape_inputs: tuple[int, ...] = ()
    data_dependent_shape: bool = False
    writes_inputs: tuple[int, ...] = ()
    control_flow: bool = False
    quantized_inputs: tuple[int, ...] = ()


_REGISTRY: dict[tuple[str, str], list[tuple[int, Converter]]] = {}
_FACTS: dict[tuple[str, str], OpFacts] = {}
_NO_FACTS = OpFacts()


def register(
    op_type: str,
    *,
    domain: str = "",
    since: int = 1,
    random: bool = False,
    shape_inputs: tuple[int, ...] = (),
    data_dependent_shape: bool = False,
    writes_inputs: tuple[int, ...] = (),
    control_flow: bool = False,
    quantized_inputs: tuple[int, ...] = (),
) -> Callable[[Converter], Converter]:
    """Register ``fn`` for ``domain::op_type`` at opset versions ``>= since``, with the op's facts (OpFacts)."""
    key = (normalize_domain(domain), op_type)
    facts = OpFacts(
        random, tuple(shape_inputs), data_dependent_shape, tuple(writes_inputs), control_flow, tuple(quantized_inputs)
    )

    def decorate(fn: Converter) -> Converter:
        entries = _REGISTRY.setdefault(key, [])
        if any(version == since for version, _ in entries):
            raise ValueError(f"converter for {domain or 'ai.onnx'}::{op_type} since {since} already registered")
        _record_facts(key, facts)
        entries.append((since, fn))
        entries.sort(key=lambda entry: -entry[0])
        return fn

    return decorate


def declare(
    op_type: str,
    *,
    domain: str = "",
    random: bool = False,
    shape_inputs: tuple[int, ...] = (),
    data_dependent_shape: bool = False,
    writes_inputs: tuple[int, ...] = (),
    control_flow: bool = False,
) -> None:
    """Record the facts (OpFacts) of ``domain::op_type``, an op this registry holds no converter for."""
    facts = OpFacts(random, tuple(shape_inputs), data_dependent_shape, tuple(writes_inputs), control_flow)
    _record_facts((normalize_domain(domain), op_type), facts)


def op_facts(domain: str, op_type: str) -> OpFacts:
    """The facts registered or declared for ``domain::op_type``; an unknown op has the defaults."""
    return _FACTS.get((normalize_domain(domain), op_type), _NO_FACTS)


def _record_facts(key: tuple[str, str], facts: OpFacts) -> None:
    known = _FACTS.setdefault(key, facts)
    if known != facts:
        raise ValueError(
            f"facts for {key[0] or 'ai.onnx'}::{key[1]} conflict: registered before as {known}, now given {facts}"
        )


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


def wrap_converters(op_type: str, wrapper: Callable[[Converter], Converter], *, domain: str = "") -> None:
    """Replace every registered converter ``fn`` of ``domain::op_type`` by ``wrapper(fn)``."""
    entries = _REGISTRY.get((normalize_domain(domain), op_type), [])
    entries[:] = [(since, wrapper(fn)) for since, fn in entries]
