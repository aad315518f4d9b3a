"""Row-wise regions on 2-D activations: ops that act on each row of ``[..., features]`` alone run on
``[rows, features]``.

``F.linear`` on a 3-D input flattens it to 2-D and back inside every call: two views forward and
two autograd nodes backward per linear, a good share of a small transformer's eager step. A
transformer's residual stream between its attentions is row-wise throughout: linears, elementwise
ops, norms over the last dim. Each connected region of such ops that holds a linear is rewritten on
2-D tensors; its inputs are flattened once and its results unflattened once where a reader needs
their shape, reshapes that ``fuse_views`` then folds into the exporters' own (heads split and merged).
The same kernels run on the same rows: values and gradients are unchanged. Eager graphs only: a
compiled step gains nothing from it (inductor sees through the views). Large linears sent to oneDNN
(``onednn_linear.linear``) stay out: their autograd Function takes 3-D inputs whole, and as rows
they ran no faster.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.passes.fuse_views import fuse_views
from ort_torch_train.passes.match import args_of, known_val, val
from ort_torch_train.passes.meta_keys import FUSIONS

_LINEAR = F.linear
_ELEMENTWISE = {
    torch.add,
    torch.sub,
    torch.mul,
    torch.div,
    torch.relu,
    torch.tanh,
    torch.sigmoid,
    F.gelu,
    F.silu,
    F.relu,
}
_LAST_DIM_NORMS = {F.layer_norm, F.rms_norm}  # (input, normalized_shape, weight[, bias], eps)
_ELEMENTWISE_KEYWORDS = {"approximate"}  # GELU's


def fuse_row_regions(module: fx.GraphModule, device: torch.device) -> None:
    """The row-wise regions of ``module``'s graph on 2-D activations (in place, for eager runs); the
    counts are added to ``module``'s ``FUSIONS``."""
    counts: Counter = Counter()
    fuse_rows(module.graph, counts)
    if counts:
        fuse_views(module.graph, counts)
        module.graph.eliminate_dead_code()
        FUSIONS.setdefault(module, Counter()).update(counts)


def fuse_rows(graph: fx.Graph, counts: Counter) -> None:
    """Rewrite the row-wise regions of ``graph`` that hold a linear on 2-D tensors, in place."""
    row_args = {node: rows for node in graph.nodes if (rows := _row_args(node)) is not None}
    in_regions = _in_regions_with_a_linear(row_args)
    converted = [node for node in graph.nodes if node in in_regions]
    flat: dict[fx.Node, fx.Node] = {}  # a tensor -> its 2-D form
    for node in converted:
        args = list(args_of(node))
        with graph.inserting_before(node):
            for index in row_args[node]:
                source = args[index]
                if source not in flat:  # a region input: flattened before its first reader
                    flat[source] = graph.call_method("reshape", (source, tuple(_rows_of(known_val(source)).shape)))
                    flat[source].meta["val"] = _rows_of(known_val(source))
                args[index] = flat[source]
            flat[node] = graph.call_function(node.target, tuple(args), dict(node.kwargs))
        flat[node].meta["val"] = _rows_of(known_val(node))
        counts["row_linear"] += node.target is _LINEAR
    for node in reversed(converted):
        if node.users:  # a reader outside the region: it gets the original shape back
            with graph.inserting_after(flat[node]):
                restored = graph.call_method("reshape", (flat[node], tuple(known_val(node).shape)))
            restored.meta["val"] = val(node)
            node.replace_all_uses_with(restored)
        graph.erase_node(node)


def _row_args(node: fx.Node) -> list[int] | None:
    """The positions of ``node``'s row tensors (shaped ``[..., features]`` like its output, rank 3 or
    more) when ``node`` is row-wise and its other tensors broadcast over the last dim only; else None."""
    out = val(node)
    if node.op != "call_function" or out is None or out.dim() < 3 or not out.is_floating_point():
        return None
    if node.kwargs and (node.target not in _ELEMENTWISE or not set(node.kwargs) <= _ELEMENTWISE_KEYWORDS):
        return None
    leading = tuple(out.shape[:-1])
    if node.target is _LINEAR:
        x = val(args_of(node)[0])
        x_rows = x is not None and tuple(x.shape[:-1]) == leading
        return [0] if x_rows and all(_rank_at_most(a, 2) for a in args_of(node)[1:]) else None
    if node.target in _LAST_DIM_NORMS:
        shape = args_of(node)[1] if len(args_of(node)) > 1 else None
        if not isinstance(shape, (tuple, list)) or list(shape) != [out.shape[-1]]:
            return None
        x = val(args_of(node)[0])
        if x is None or x.shape != out.shape:
            return None
        others = [a for a in args_of(node)[2:] if isinstance(a, fx.Node)]
        return [0] if all(_rank_at_most(a, 1) for a in others) else None
    if node.target in _ELEMENTWISE:
        rows: list[int] = []
        for index, arg in enumerate(args_of(node)):
            if isinstance(arg, fx.Node):
                arg_val = val(arg)
                if arg_val is None:
                    return None
                if arg_val.shape == out.shape:
                    rows.append(index)
                elif arg_val.dim() > 1:
                    return None
            elif not isinstance(arg, (int, float, bool)):
                return None
        return rows or None
    return None


def _in_regions_with_a_linear(row_args: dict[fx.Node, list[int]]) -> set[fx.Node]:
    """The row-wise nodes connected through their row tensors to a linear."""
    parent = {node: node for node in row_args}

    def root(node: fx.Node) -> fx.Node:
        while parent[node] is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node, rows in row_args.items():
        for index in rows:
            if args_of(node)[index] in parent:
                parent[root(args_of(node)[index])] = root(node)
    with_linear = {root(node) for node in row_args if node.target is _LINEAR}
    return {node for node in row_args if root(node) in with_linear}


def _rank_at_most(node: object, rank: int) -> bool:
    value = val(node)
    return value is not None and value.dim() <= rank


def _rows_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.new_empty((math.prod(tensor.shape[:-1]), tensor.shape[-1]))
