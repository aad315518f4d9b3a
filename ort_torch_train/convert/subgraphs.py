"""Graph attributes (If branches, Loop and Scan bodies) and the names graphs read across them."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held by ``node``'s attributes."""
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def outer_names(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` (or a graph nested in it) reads from enclosing scopes, in first-use order."""
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    defined |= {name for node in graph.node for name in node.output}
    names: dict[str, None] = {}
    for node in graph.node:
        for name in [*node.input, *(n for g in subgraphs(node) for n in outer_names(g))]:
            if name and name not in defined:
                names[name] = None
    for output in graph.output:
        if output.name not in defined:
            names[output.name] = None
    return list(names)


def node_reads(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads: its inputs and what its subgraphs read from enclosing scopes."""
    return {name for name in [*node.input, *(n for g in subgraphs(node) for n in outer_names(g))] if name}


def names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name ``graph``'s nodes, their subgraphs and its outputs read."""
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(node.input)
        for subgraph in subgraphs(node):
            read |= names_read(subgraph)
    return read
