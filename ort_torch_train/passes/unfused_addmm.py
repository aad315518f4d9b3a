"""A float32 CPU ``addmm(bias, a, b)`` written as ``mm(a, b) + bias``, the add fused into the loop reading the product.

A compiled program calls ``addmm`` as an extern kernel, and torch's CPU ``addmm`` first copies the broadcast bias
into its output (a dispatcher call and a copy loop of its own) before the GEMM adds the product to it. Inductor
splits ``addmm`` this way only on GPUs (``should_prefer_unfused_addmm`` in its post-grad passes); after the split
the extern call is a plain ``mm`` and inductor fuses the bias add into the pointwise loop that follows (a ReLU, the
loss). Results agree with the extern ``addmm``'s to float32 rounding (the bias added after the product, not
before).

It runs as an inductor post-grad pass, after inductor's own patterns (which would fuse the add back into
``addmm`` on a CPU): ``unfused_addmm_pass`` in the package builder's programs (``training/package/programs.py``);
``compile=True``'s CPU graphs split small ``addmm`` in ``onednn_linear.cpu_matmuls`` through ``unfused_product``.
"""

from __future__ import annotations

import functools

import torch
from torch import fx

from ort_torch_train.passes.match import args_of, val
from ort_torch_train.torch_internals import GraphPass, custom_graph_pass, hash_of_files

_aten = torch.ops.aten


def unfuse_addmm(graph: fx.Graph) -> int:
    """Rewrite ``graph``'s float32 CPU ``addmm(bias, a, b)`` with no scaling as ``mm(a, b) + bias``; how many."""
    count = 0
    for node in list(graph.nodes):
        operands = _addmm_operands(node)
        if operands is None:
            continue
        a, b, bias = operands
        with graph.inserting_before(node):
            product = unfused_product(graph, node, a, b, bias)
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        count += 1
    return count


def unfused_product(graph: fx.Graph, node: fx.Node, a: fx.Node, b: fx.Node, bias: fx.Node) -> fx.Node:
    """``mm(a, b) + bias`` inserted at ``graph``'s insertion point, standing for ``node`` (an ``addmm``): the add
    takes ``node``'s meta, the product its value."""
    unfused = graph.call_function(_aten.mm.default, (a, b))
    unfused.meta["val"] = node.meta["val"]
    product = graph.call_function(_aten.add.Tensor, (unfused, bias))
    product.meta = dict(node.meta)
    return product


@functools.cache  # one instance per argument: inductor's caches compare it
def unfused_addmm_pass(then: GraphPass | None = None) -> GraphPass:
    """``unfuse_addmm`` as an inductor post-grad pass, followed by the inductor pass ``then`` where given; keyed in
    inductor's caches by this file's hash and ``then``'s key."""

    def apply(graph: fx.Graph) -> None:
        unfuse_addmm(graph)
        if then is not None:
            then(graph)

    def uuid() -> bytes:
        key = hash_of_files((__file__,))
        return key if then is None else key + then.uuid()

    return custom_graph_pass("UnfusedAddmm", apply, uuid)


def _addmm_operands(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """``(a, b, bias)`` of a float32 CPU ``addmm(bias, a, b)`` with no scaling, else None."""
    if node.op != "call_function" or node.target is not _aten.addmm.default or len(node.args) != 3:
        return None
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None
    bias, a, b = args_of(node)
    values = [val(arg) for arg in (bias, a, b)]
    if not all(value is not None and value.dtype == torch.float32 and value.device.type == "cpu" for value in values):
        return None
    return a, b, bias
