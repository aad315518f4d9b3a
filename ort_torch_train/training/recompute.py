"""Activation recomputation: the converted forward cut into segments run under ``torch.utils.checkpoint``.

``Module(recompute=k)`` splits the train graph's ops, in execution order, into ``k`` segments of
about equal op counts (``torch.fx.passes.split_module``), like ``checkpoint_sequential``. Backward
keeps only the tensors that cross segment boundaries and recomputes each segment's activations when
it reaches it: less activation memory for one more forward. RNG state is replayed, so dropout
masks are the same in the recomputation. ``recompute=True`` uses one segment per sqrt(op count).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module
from torch.utils.checkpoint import checkpoint

RecomputeSetting = bool | int | None


def recompute_segments(setting: RecomputeSetting) -> int | bool | None:
    """The checked ``recompute`` argument: None/False (off), True (automatic) or a segment count >= 1."""
    if setting is None or setting is False or setting is True:
        return setting or None
    if isinstance(setting, int) and setting >= 1:
        return setting
    raise ValueError(f"recompute: expected None, True or a number of segments >= 1; got {setting!r}")


class _Checkpointed(nn.Module):
    """A segment whose activations are recomputed in backward instead of being kept."""

    def __init__(self, segment: nn.Module) -> None:
        super().__init__()
        self.segment = segment

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.segment(*args)
        return checkpoint(self.segment, *args, use_reentrant=False)


def with_recompute(module: fx.GraphModule, segments: int | bool) -> fx.GraphModule:
    """``module`` with its ops split into ``segments`` checkpointed segments (True: about sqrt(op count))."""
    ops = [node for node in module.graph.nodes if node.op not in ("placeholder", "output", "get_attr")]
    if not ops:
        return module
    count = max(1, round(math.sqrt(len(ops)))) if segments is True else min(segments, len(ops))
    index = {node: position * count // len(ops) for position, node in enumerate(ops)}
    split = split_module(module, module, lambda node: index[node], keep_original_order=True)
    for name, child in list(split.named_children()):
        if name.startswith("submod_"):
            setattr(split, name, _Checkpointed(child))
    return split


def checkpoint_ranges(module: fx.GraphModule, ops: list[fx.Node], ranges: list[tuple[int, int]]) -> fx.GraphModule:
    """``module`` with each ``(first, last)`` run of ``ops`` (sorted, disjoint) as one checkpointed segment, a
    module of its own; the ops outside the runs stay where they are (a sharded run cuts them into its units)."""
    for number, (first, last) in enumerate(ranges):
        _extract(module, ops[first : last + 1], f"recomputed_{number}")
    module.graph.lint()
    module.recompile()
    return module


def _extract(module: fx.GraphModule, region: list[fx.Node], name: str) -> None:
    """The ``region``'s nodes (consecutive in ``module``'s graph) moved into a checkpointed submodule ``name``
    that takes the values they read from outside (but attributes) and returns those read after them."""
    inside = set(region)
    read = dict.fromkeys(arg for node in region for arg in node.all_input_nodes if arg not in inside)
    inputs = [arg for arg in read if arg.op != "get_attr"]  # the attributes read: read inside again
    outputs = [node for node in region if any(user not in inside for user in node.users)]
    graph = fx.Graph()
    values: dict[fx.Node, fx.Node] = {arg: graph.placeholder(arg.name) for arg in inputs}
    values.update({arg: graph.node_copy(arg) for arg in read if arg.op == "get_attr"})
    for node in region:
        values[node] = graph.node_copy(node, lambda arg: values[arg])
    graph.output(values[outputs[0]] if len(outputs) == 1 else tuple(values[node] for node in outputs))
    module.add_submodule(name, _Checkpointed(fx.GraphModule(module, graph)))
    with module.graph.inserting_before(region[0]):
        call = module.graph.call_module(name, tuple(inputs))
        for index, node in enumerate(outputs):
            result = call if len(outputs) == 1 else module.graph.call_function(operator.getitem, (call, index))
            node.replace_all_uses_with(result, delete_user_cb=lambda user: user not in inside)
    for node in reversed(region):
        module.graph.erase_node(node)
