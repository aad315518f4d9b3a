"""Converter lookup: the project's adapters first, then onnx2torch's registry."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import onnx

from ort_torch_train import adapters
from ort_torch_train.adapters.registry import OpLibrary, SubgraphConverter
from ort_torch_train.convert.control_flow import CONTROL_FLOW_OPS
from ort_torch_train.convert.subgraphs import subgraphs
from ort_torch_train.errors import UnsupportedOperatorError
from ort_torch_train.onnx2torch_import import import_onnx2torch

NodeConverter = Callable[[onnx.NodeProto, onnx.GraphProto], Any]


def _onnx2torch_converter(domain: str, op_type: str, opset: int) -> Callable[..., Any] | None:
    import_onnx2torch()
    from onnx2torch.node_converters import get_converter

    try:
        return get_converter(operation_type=op_type, version=opset, domain=domain)
    except NotImplementedError:
        return None


def has_converter(domain: str, op_type: str, opset: int, library: OpLibrary | None = None) -> bool:
    """Whether some converter handles ``domain::op_type`` at ``opset`` (``library``: the session's own ops)."""
    return (
        (library is not None and library.converter(domain, op_type) is not None)
        or (domain == "" and op_type in CONTROL_FLOW_OPS)
        or adapters.find_converter(domain, op_type, opset) is not None
        or _onnx2torch_converter(domain, op_type, opset) is not None
    )


def converter_for(
    domain: str,
    op_type: str,
    opset: int,
    training: bool,
    opsets: dict[str, int] | None = None,
    convert_subgraph: SubgraphConverter | None = None,
    library: OpLibrary | None = None,
) -> NodeConverter:
    """A function ``(node, one_node_graph) -> (module, mapping)`` for the operator (``opsets``: the graph's;
    ``convert_subgraph``: how the graph's conversion converts graph attributes; ``library``: the session's
    own ops, first)."""
    import_onnx2torch()
    from onnx2torch.onnx_graph import OnnxGraph

    own = library.converter(domain, op_type) if library is not None else None
    own = own or adapters.find_converter(domain, op_type, opset)
    context = adapters.ConversionContext(
        training=training, opset=opset, opsets=dict(opsets or {}), convert_subgraph=convert_subgraph
    )
    fallback = None if own else _onnx2torch_converter(domain, op_type, opset)
    if own is None and fallback is None:
        raise unsupported_operator_error(domain, op_type, opset)

    def convert(node: onnx.NodeProto, graph: onnx.GraphProto) -> Any:
        onnx_graph = OnnxGraph(graph)
        onnx_node = next(iter(onnx_graph.nodes.values()))
        if own is not None:
            return own(onnx_node, onnx_graph, context)
        assert fallback is not None  # (checked above)
        return fallback(onnx_node, onnx_graph)

    return convert


def unsupported_operator_error(domain: str, op_type: str, opset: int, node_name: str = "") -> UnsupportedOperatorError:
    where = f" (node {node_name!r})" if node_name else ""
    return UnsupportedOperatorError(
        f"no converter for operator {op_type} of domain {domain or 'ai.onnx'} at opset {opset}{where}; "
        f"register one with ort_torch_train.adapters.register (docs/converters.md)"
    )


def check_supported(graph: onnx.GraphProto, opsets: dict[str, int], library: OpLibrary | None = None) -> None:
    """Raise UnsupportedOperatorError for the first node (subgraphs included) no converter handles."""
    for node in graph.node:
        domain = adapters.normalize_domain(node.domain)
        opset = opsets.get(domain, 1)
        if not has_converter(domain, node.op_type, opset, library):
            raise unsupported_operator_error(domain, node.op_type, opset, node.name)
        for subgraph in subgraphs(node):
            check_supported(subgraph, opsets, library)


def check_differentiable(graph: onnx.GraphProto, trainable: Collection[str], library: OpLibrary) -> None:
    """Raise UnsupportedOperatorError for the first node of ``library`` that gradients must flow back
    through (some input depends on a trainable parameter) where the library cannot differentiate it."""
    depends: dict[str, str] = {name: name for name in trainable}  # value -> a trainable parameter it depends on
    for node in graph.node:
        parameter = next((depends[name] for name in node.input if name in depends), None)
        if parameter is None:
            continue
        domain = adapters.normalize_domain(node.domain)
        if library.converter(domain, node.op_type) is not None and not library.differentiable(domain, node.op_type):
            raise UnsupportedOperatorError(
                f"custom op {domain or 'ai.onnx'}::{node.op_type} (node {node.name!r}) has no gradient, and the "
                f"trainable parameter {parameter!r} needs one through it: freeze {parameter!r}, or move the op "
                "where no trainable parameter is upstream of it (the eval model, or a frozen path)"
            )
        depends.update((name, parameter) for name in node.output if name)
