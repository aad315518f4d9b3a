"""Reshapes of broadcasts in compiled graphs read a contiguous copy, so that batch 1 shares the graph.

A grouped-query attention repeats its key and value heads as unsqueeze -> expand -> reshape (an ONNX
Expand then Reshape). Inductor lowers a reshape of a stored broadcast as a view whose strides it
computes with guards that each leading size is not 1 (``View.create``, outside the size-oblivious
tracing that lets a graph made for sizes >= 2 serve size 1), so the compiled step rejects batch 1 and
compiles again. ``contiguous_broadcast_reshapes`` puts a ``contiguous()`` between such an expand and
its reshape: the reshape then views a contiguous buffer, which needs no stride guard. The copy is
the one the attention's matrix product makes of the broadcast anyway; the values are the same.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import fx

from ort_torch_train.adapters.shape_ops import expand_dynamic
from ort_torch_train.passes.meta_keys import FUSIONS

_RESHAPE_METHODS = ("reshape", "view")


def _is_expand(node: object) -> bool:
    return isinstance(node, fx.Node) and (
        (node.op == "call_method" and node.target == "expand")
        or (node.op == "call_function" and node.target in (expand_dynamic, torch.Tensor.expand))
    )


def _is_reshape(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target in _RESHAPE_METHODS) or (
        node.op == "call_function" and node.target is torch.reshape
    )


def contiguous_broadcast_reshapes(module: fx.GraphModule, device: torch.device) -> None:
    """``module``'s reshapes of an expand's output rewritten to reshape its contiguous copy (in place,
    for torch.compile); the count is added to ``module``'s ``FUSIONS``."""
    rewritten = 0
    for node in list(module.graph.nodes):
        source = node.args[0] if node.args else None
        if _is_reshape(node) and _is_expand(source):
            with module.graph.inserting_after(source):
                copy = module.graph.call_method("contiguous", (source,))
            node.replace_input_with(source, copy)
            rewritten += 1
    if rewritten:
        FUSIONS.setdefault(module, Counter())["contiguous_broadcast_reshapes"] += rewritten
