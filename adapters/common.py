"""Helpers shared by the converters: attributes, constant inputs, input/output mappings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ort_torch_train.dtypes import tensor_from_proto, torch_dtype
from ort_torch_train.onnx2torch_import import import_onnx2torch
from ort_torch_train.torch_internals import traced_by_make_fx

import_onnx2torch()
from onnx2torch.onnx_graph import OnnxGraph, OnnxNode  # noqa: E402
from onnx2torch.utils.common import OnnxMapping, OperationConverterResult  # noqa: E402


def attributes(node: OnnxNode) -> dict[str, Any]:
    """The node's attributes as Python values (onnx2torch's parsing)."""
    return dict(node.attributes)


def is_constant(node: OnnxNode, graph: OnnxGraph, position: int) -> bool:
    """Whether input ``position`` is present and constant in the conversion graph."""
    inputs = node.input_values
    return position < len(inputs) and inputs[position] in graph.initializers


def constant_input(node: OnnxNode, graph: OnnxGraph, position: int) -> torch.Tensor:
    """The value of constant input ``position``."""
    return tensor_from_proto(graph.initializers[node.input_values[position]].proto)  # (bfloat16 too)


def input_shape(node: OnnxNode, graph: OnnxGraph, position: int = 0) -> tuple[int, ...]:
    """The concrete shape of input ``position`` (constant or not)."""
    name = node.input_values[position]
    if name in graph.initializers:
        return tuple(graph.initializers[name].proto.dims)
    dims = graph.value_info[name].type.tensor_type.shape.dim
    return tuple(dim.dim_value for dim in dims)


def mapping(node: OnnxNode, inputs: Sequence[str] | None = None) -> OnnxMapping:
    """The mapping that feeds ``inputs`` (default: all of the node's inputs) at run time."""
    return OnnxMapping(inputs=tuple(node.input_values if inputs is None else inputs), outputs=node.output_values)


def result(module: torch.nn.Module, node: OnnxNode, inputs: Sequence[str] | None = None) -> OperationConverterResult:
    """A converter result running ``module`` on ``inputs``."""
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping(node, inputs))


class Inline(torch.nn.Module):
    """A converter result emitted as a plain call, not a submodule: no nn.Module call overhead.

    ``function`` is a callable (emitted as ``function(*inputs, *extra_args, **kwargs)``) or the
    name of a tensor method (emitted as ``inputs[0].name(*inputs[1:], *extra_args, **kwargs)``).
    """

    def __init__(self, function: Any, *extra_args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.function, self.extra_args, self.kwargs = function, extra_args, kwargs

    def forward(self, *inputs: Any) -> Any:
        if isinstance(self.function, str):
            return getattr(inputs[0], self.function)(*inputs[1:], *self.extra_args, **self.kwargs)
        return self.function(*inputs, *self.extra_args, **self.kwargs)


def has_input(node: OnnxNode, position: int) -> bool:
    """Whether optional input ``position`` is given (present and not the empty name)."""
    inputs = node.input_values
    return position < len(inputs) and bool(inputs[position])


def constant_ints(node: OnnxNode, graph: OnnxGraph, position: int) -> list[int] | None:
    """A constant input as a list of Python ints, or None when it is absent or not constant."""
    if not has_input(node, position) or not is_constant(node, graph, position):
        return None
    return [int(v) for v in constant_input(node, graph, position).reshape(-1).tolist()]


def compiling_ahead() -> bool:
    """Whether the running code is being traced into a compiled program: by torch.compile, or by make_fx
    for an AOTInductor package (``training/package``). Converters choose their compiled forms then."""
    return torch.compiler.is_compiling() or traced_by_make_fx()


def tracing_package() -> bool:
    """Whether make_fx traces the running code for an AOTInductor package (``training/package``), not
    torch.compile: the package's steps run where no Python is, so no op defined in Python may enter them."""
    return not torch.compiler.is_compiling() and traced_by_make_fx()


def guard_or_false(condition: bool | torch.SymBool) -> bool:
    """``condition`` where it is decided; False where the trace cannot decide it (a size read from data).
    Outside a trace (``compiling_ahead``) every size is a number, and the symbolic-shape machinery is not imported."""
    if not compiling_ahead():
        return bool(condition)
    from torch.fx.experimental import symbolic_shapes

    return symbolic_shapes.guard_or_false(condition)


def guard_or_true(condition: bool | torch.SymBool) -> bool:
    """``condition`` where it is decided; True where the trace cannot decide it."""
    if not compiling_ahead():
        return bool(condition)
    from torch.fx.experimental import symbolic_shapes

    return symbolic_shapes.guard_or_true(condition)


def if_else(condition: bool | torch.SymBool, then: Any, otherwise: Any) -> Any:
    """``then if condition else otherwise``; where the trace cannot decide ``condition`` (a size read
    from data), an expression of both that the compiled step evaluates (``torch.sym_ite``)."""
    if guard_or_false(condition):
        return then
    if not guard_or_true(condition):
        return otherwise
    return torch.sym_ite(condition, then, otherwise)


def clamp_size(value: Any, low: Any, high: Any) -> Any:
    """``value`` clamped to ``[low, high]``, deciding nothing the trace cannot (``if_else``)."""
    value = if_else(value < low, low, value)
    return if_else(value > high, high, value)


def values_of(values: torch.Tensor | list) -> list:
    """A 1-d integer tensor's entries, or the list a compiled graph computed them as already
    (``passes/shape_values.py``)."""
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


def sizes_of(values: torch.Tensor | list, least: int = 0) -> list:
    """``values_of`` a shape input whose entries are sizes, each declared to the trace (``compiling_ahead``) as
    at least ``least`` where it is formed: a size read from data (the tokens a Mixture-of-Experts layer routes
    to one expert) is otherwise a value torch knows nothing of, and any comparison on it a guard it cannot make."""
    sizes = values_of(values)
    if compiling_ahead():
        for size in sizes:
            torch._check(size >= least)
    return sizes


def input_dtype(node: OnnxNode, graph: OnnxGraph, position: int = 0) -> torch.dtype:
    """The torch dtype of input ``position`` (constant or not)."""
    name = node.input_values[position]
    if name in graph.initializers:
        return torch_dtype(graph.initializers[name].proto.data_type)
    return torch_dtype(graph.value_info[name].type.tensor_type.elem_type)


def scalar_constant(node: OnnxNode, graph: OnnxGraph, position: int) -> float | int | bool | None:
    """A present constant one-element input as a Python number, else None."""
    if not has_input(node, position) or not is_constant(node, graph, position):
        return None
    value = constant_input(node, graph, position)
    return value.reshape(-1)[0].item() if value.numel() == 1 else None


def normalize_axis(axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)`` (ONNX allows ``[-rank, rank)``)."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0
