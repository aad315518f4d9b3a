"""Views in compiled graphs rewritten so that inductor needs no guard that a dynamic size is not 1.

A compiled step made for sizes >= 2 serves size 1 too (``torch_internals.size_one_kept_dynamic``),
as long as nothing after Dynamo's size-oblivious tracing guards a size against 1. Two of inductor's
own steps do, and the compiled step then rejects batch 1 and compiles again:
* a reshape of a stored broadcast (a grouped-query attention's key and value heads repeated as
  unsqueeze -> expand -> reshape, an ONNX Expand then Reshape) is lowered as a view whose strides
  inductor computes with guards that each leading size is not 1 (``View.create``). The reshape reads
  a ``contiguous()`` copy instead: a view of a contiguous buffer needs no stride guard, and the copy
  is the one the attention's matrix product makes of the broadcast anyway;
* the backward of ``torch.select`` along an inner axis (BERT's pooler taking the first token, an
  ONNX Gather of one index) writes the gradient into a selected view of zeros, and inductor's
  reinplacing checks that view for internal overlap with a guard that the batch is at least 2. The
  row is picked with ``index_select`` instead, whose backward adds into the zeros by index.
The values are the same either way.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import fx

from ort_torch_train.adapters.shape_ops import expand_dynamic
from ort_torch_train.passes.match import val
from ort_torch_train.passes.meta_keys import FUSIONS

_RESHAPE_METHODS = ("reshape", "view")


def picked_by_index(x: torch.Tensor, axis: int, index: int) -> torch.Tensor:
    """``torch.select(x, axis, index)`` as an ``index_select`` of that one index, the axis dropped."""
    index = index + x.shape[axis] if index < 0 else index
    picked = torch.full((1,), index, dtype=torch.int64, device=x.device)
    return x.index_select(axis, picked).squeeze(axis)


def no_size_one_guards(module: fx.GraphModule, device: torch.device) -> None:
    """``module``'s reshapes of an expand's output rewritten to reshape its contiguous copy, and its
    selects along an inner axis of a floating-point tensor to ``picked_by_index`` (in place, for
    torch.compile); the counts are added to ``module``'s ``FUSIONS``."""
    counts: Counter[str] = Counter()
    for node in list(module.graph.nodes):
        source = node.args[0] if node.args else None
        if _is_reshape(node) and _is_expand(source):
            with module.graph.inserting_after(source):
                copy = module.graph.call_method("contiguous", (source,))
            node.replace_input_with(source, copy)
            counts["contiguous_broadcast_reshapes"] += 1
        elif _is_inner_select(node):
            node.target = picked_by_index
            counts["selects_by_index"] += 1
    if counts:
        FUSIONS.setdefault(module, Counter()).update(counts)


def _is_expand(node: object) -> bool:
    return isinstance(node, fx.Node) and (
        (node.op == "call_method" and node.target == "expand")
        or (node.op == "call_function" and node.target is expand_dynamic)
    )


def _is_reshape(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target in _RESHAPE_METHODS) or (
        node.op == "call_function" and node.target is torch.reshape
    )


def _is_inner_select(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not torch.select or len(node.args) != 3 or node.kwargs:
        return False
    source, axis, index = node.args
    value = val(source)
    return (
        isinstance(axis, int)
        and isinstance(index, int)
        and isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and 0 < axis % max(value.dim(), 1)
    )
