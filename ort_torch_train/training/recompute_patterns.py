"""ORT's legacy recompute settings as ``torch.utils.checkpoint`` regions of the converted graph.

ORT 1.13's graph transformers (``orttraining/core/optimizer/localized_recompute.cc`` and
``transformer_layer_recompute.cc``) decide what is recomputed; here each choice becomes a region
of the fx graph run under checkpoint, so backward keeps the region's inputs and recomputes the rest:

* ``gelu``: a GELU whose readers are matmuls, with those matmuls (ORT recomputes the Gelu output
  for the MatMul's gradient; in torch the matmul saves that output, so it belongs to the region);
  unlike ORT, also with one Dropout between them (nn.TransformerEncoderLayer's feed-forward);
* ``attention dropout``: a Dropout between a Softmax and a MatMul, with that MatMul (the softmax
  output stays saved, the dropped-out probabilities are recomputed with the same mask);
* ``transformer layers``: the first ``n`` transformer layers, ``n`` = number_recompute_layers, or
  all but the last when 0; more than that is clipped to it with a warning, as ORT does (the last
  layer's activations are needed first in backward, recomputing them saves nothing). A layer is
  found structurally: one attention (a softmax read by a matmul, or a fused attention call) per
  layer, the layers separated by the last point before the next attention where one activation
  carries everything (the post-LayerNorm hidden state, or the residual sum of a pre-LN layer).

A region is the run of ops from its first to its last node in the graph's order, moved into a
checkpointed submodule (``checkpoint_ranges``); the ops outside the regions stay in the graph. A setting that
finds nothing to recompute warns and leaves the graph alone (ORT leaves it alone silently).
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.passes import onednn_linear
from ort_torch_train.training.recompute import checkpoint_ranges

_MATMULS = (torch.matmul, *onednn_linear.LINEARS, torch.bmm, torch.mm)
_SOFTMAXES = (torch.softmax, F.softmax)


@dataclass(frozen=True)
class RecomputePlan:
    """What to recompute; ``transformer_layers`` None is off, 0 all layers but the last, n the first n."""

    gelu: bool = False
    attention_dropout: bool = False
    transformer_layers: int | None = None

    def __bool__(self) -> bool:
        return self.gelu or self.attention_dropout or self.transformer_layers is not None


def with_pattern_recompute(module: fx.GraphModule, plan: RecomputePlan, user_inputs: int) -> fx.GraphModule:
    """``module`` with the regions ``plan`` names checkpointed (graph inputs after ``user_inputs`` are parameters)."""
    ops = [node for node in module.graph.nodes if node.op not in ("placeholder", "output", "get_attr")]
    position = {node: index for index, node in enumerate(ops)}
    ranges: list[tuple[int, int]] = []
    if plan.transformer_layers is not None:
        ranges = _layer_ranges(module, ops, position, user_inputs, plan.transformer_layers)
    local = []
    if plan.gelu:
        local += _found("gelu_recompute", "GELU read by a MatMul", _gelu_regions(module, ops, position))
    if plan.attention_dropout:
        local += _found(
            "attn_dropout_recompute",
            "Dropout between a Softmax and a MatMul (attention dropout)",
            _attention_dropout_regions(module, ops, position),
        )
    ranges += [
        (first, last) for first, last in local if not any(start <= last and first <= end for start, end in ranges)
    ]  # inside a recomputed layer
    return checkpoint_ranges(module, ops, _merged(ranges)) if ranges else module


def _found(setting: str, pattern: str, regions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if not regions:
        warnings.warn(
            f"TrainingParameters.{setting}: the graph has no {pattern}; nothing is recomputed for it", stacklevel=2
        )
    return regions


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
        else:
            merged.append((first, last))
    return merged


# ---- local patterns -------------------------------------------------------------------------------
def _kind(module: fx.GraphModule, node: fx.Node) -> str:
    """``node``'s callee in words: a function's name, a method name or a converter module's class."""
    if node.op == "call_module":
        return type(module.get_submodule(str(node.target))).__name__
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _is_matmul(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in _MATMULS) or (
        node.op == "call_method" and node.target in ("matmul", "bmm", "mm")
    )


def _readers(node: fx.Node) -> list[fx.Node]:
    """The nodes reading ``node``'s tensor (through ``getitem(node, 0)`` for a module returning a tuple)."""
    readers = []
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem:
            readers += list(user.users) if user.args[1] == 0 else []
        else:
            readers.append(user)
    return readers


def _region_into_matmuls(
    module: fx.GraphModule, start: fx.Node, position: dict[fx.Node, int], through_dropout: bool = False
) -> tuple[int, int] | None:
    readers = _readers(start)
    if through_dropout and len(readers) == 1 and _kind(module, readers[0]) == "Dropout":
        readers = _readers(readers[0])
    if not readers or not all(_is_matmul(reader) for reader in readers):
        return None
    return position[start], max(position[reader] for reader in readers)


def _gelu_regions(module: fx.GraphModule, ops: list[fx.Node], position: dict) -> list[tuple[int, int]]:
    regions = []
    for node in ops:
        if (node.op == "call_function" and node.target is F.gelu) or "Gelu" in _kind(module, node):
            region = _region_into_matmuls(module, node, position, through_dropout=True)
            if region is not None:
                regions.append(region)
    return regions


def _is_softmax(node: object) -> bool:
    return isinstance(node, fx.Node) and (
        (node.op == "call_function" and node.target in _SOFTMAXES)
        or (node.op == "call_method" and node.target == "softmax")
    )


def _attention_dropout_regions(module: fx.GraphModule, ops: list[fx.Node], position: dict) -> list[tuple[int, int]]:
    regions = []
    for node in ops:
        is_dropout = (node.op == "call_function" and node.target is F.dropout) or _kind(module, node) == "Dropout"
        if is_dropout and node.args and _is_softmax(node.args[0]):
            region = _region_into_matmuls(module, node, position)
            if region is not None:
                regions.append(region)
    return regions


# ---- transformer layers ---------------------------------------------------------------------------
def _layer_ranges(
    module: fx.GraphModule, ops: list[fx.Node], position: dict, user_inputs: int, wanted: int
) -> list[tuple[int, int]]:
    attention = [position[node] for node in ops if _is_attention(module, node)]
    cuts = _cut_positions(module, ops, position, user_inputs)
    ends = []
    for previous, current in zip(attention, attention[1:]):
        between = [cut for cut in cuts if previous < cut < current]
        if not between:
            warnings.warn(
                "TrainingParameters.transformer_layer_recompute: the attentions at graph positions "
                f"{previous} and {current} are not separated by a single hidden state; no layer is "
                "recomputed",
                stacklevel=3,
            )
            return []
        ends.append(between[-1])
    limit = len(ends)  # every layer but the last
    if limit == 0:
        warnings.warn(
            f"TrainingParameters.transformer_layer_recompute: the graph has {len(attention)} "
            "transformer layer(s); the last layer is never recomputed, so nothing is",
            stacklevel=3,
        )
        return []
    if wanted > limit:
        warnings.warn(
            f"TrainingParameters.number_recompute_layers {wanted} is larger than the limit {limit} "
            f"({limit + 1} layers, the last is never recomputed); clipped to {limit}",
            stacklevel=3,
        )
    count = limit if wanted == 0 else min(wanted, limit)
    before_first = [cut for cut in cuts if cut < attention[0]]
    starts = [before_first[-1] + 1 if before_first else 0] + [end + 1 for end in ends]
    return list(zip(starts[:count], ends[:count]))


def _is_attention(module: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_function" and node.target is F.scaled_dot_product_attention:
        return True
    if not _is_softmax(node):
        return False
    probabilities = [node, *[reader for reader in _readers(node) if _kind(module, reader) == "Dropout"]]
    return any(_is_matmul(reader) for p in probabilities for reader in _readers(p))


def _cut_positions(module: fx.GraphModule, ops: list[fx.Node], position: dict, user_inputs: int) -> list[int]:
    """Positions after which one activation (a value computed from the parameters) is all that is still read."""
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    carrying = set(placeholders[user_inputs:])
    end = len(ops)
    cuts, last_read = [], -1
    for index, node in enumerate(ops):
        if last_read <= index:
            cuts.append(index)
        if any(arg in carrying for arg in node.all_input_nodes):
            carrying.add(node)
            last_read = max(last_read, max((position.get(user, end) for user in node.users), default=index))
    return [cut for cut in cuts if ops[cut] in carrying]
