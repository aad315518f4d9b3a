"""Fold chains of permutes and of reshapes that the exporters write around attention and heads.

``permute(permute(x, p1), p2)`` -> one ``permute`` (or ``x`` when they cancel); a chain of
reshape / squeeze / unsqueeze / flatten -> one ``reshape`` to the last shape (or ``x`` when it has
``x``'s shape). Only nodes whose intermediate results have no other reader are folded.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import fx

from ort_torch_train.passes.match import args_of, is_call, known_val, val

_RESHAPES = ("reshape", "view", torch.reshape, torch.squeeze, torch.unsqueeze, torch.flatten)


def fuse_views(graph: fx.Graph, counts: Counter) -> None:
    """Fold permute chains and reshape chains in ``graph`` in place, counting folded nodes in ``counts``."""
    for node in list(graph.nodes):
        permutation = _permutation(node)
        if permutation is not None:
            source = args_of(node)[0]
            inner = _permutation(source) if len(source.users) == 1 else None
            if inner is not None:
                permutation, source = tuple(inner[axis] for axis in permutation), args_of(source)[0]
            if inner is not None or permutation == tuple(range(len(permutation))):
                _replace(
                    graph,
                    node,
                    source,
                    "permute",
                    permutation if permutation != tuple(range(len(permutation))) else None,
                )
                counts["view_chain"] += 1
        elif _is_reshape(node):
            source = args_of(node)[0]
            if isinstance(source, fx.Node) and _is_reshape(source) and len(source.users) == 1:
                shape = tuple(known_val(node).shape)
                source = args_of(source)[0]
                _replace(graph, node, source, "reshape", shape if shape != tuple(known_val(source).shape) else None)
                counts["view_chain"] += 1


def _permutation(node) -> tuple[int, ...] | None:
    """The full permutation a ``permute``/``transpose`` node applies, else None."""
    node_val = val(node)
    if node_val is None or not isinstance(args_of(node)[0] if args_of(node) else None, fx.Node):
        return None
    rank = node_val.dim()
    if is_call(node, "permute", 2) and isinstance(args_of(node)[1], (tuple, list)):
        return tuple(int(axis) % rank for axis in args_of(node)[1])
    if is_call(node, "transpose", 3):
        order = list(range(rank))
        first, second = args_of(node)[1] % rank, args_of(node)[2] % rank
        order[first], order[second] = order[second], order[first]
        return tuple(order)
    return None


def _is_reshape(node) -> bool:
    if not isinstance(node, fx.Node) or node.op not in ("call_method", "call_function") or node.target not in _RESHAPES:
        return False
    return isinstance(args_of(node)[0], fx.Node) and val(node) is not None and val(args_of(node)[0]) is not None


def _replace(graph: fx.Graph, node: fx.Node, source: fx.Node, method: str, argument: tuple | None) -> None:
    if argument is None:
        node.replace_all_uses_with(source)
        return
    with graph.inserting_before(node):
        folded = graph.call_method(method, (source, argument))
    folded.meta["val"] = val(node)
    node.replace_all_uses_with(folded)
