"""Merged axes of a permuted tensor in compiled graphs: reshaped from a row-major copy.

An exporter writes a Transpose before a Reshape that merges axes: a bidirectional RNN's two directions,
(length, 2, batch, hidden) -> (length, batch, 2, hidden) -> (length, batch, 2 hidden); attention's
heads. torch's ``reshape`` of the permuted tensor is a view where the merged axes are adjacent in memory,
which for a permutation is a question of sizes (here: the batch is 1), and torch.compile guards on
the answer: a graph for batch 1 and one for the other sizes. ``copy_permuted_merges`` rewrites such a
reshape in a compiled graph into ``reshape_copied``: the copy torch's reshape makes at every other size,
so the same values and the same work, with nothing decided on the sizes. Eager graphs keep ``reshape``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, fx

from ort_torch_train.passes.match import args_of, is_call, replace_with_call, val
from ort_torch_train.passes.meta_keys import FUSIONS

_PERMUTES = ("permute", "transpose", torch.permute, torch.transpose)
_RESHAPES = ("reshape", "view", torch.reshape)


class _CopiedReshape(torch.autograd.Function):
    """Reshape of a row-major copy, whose backward views a row-major copy of the gradient: the gradient
    arrives permuted, and ``reshape``'s own backward (a reshape of it) would decide on the sizes again."""

    @staticmethod
    def forward(x: Tensor, shape: Sequence[int]) -> Tensor:
        return x.clone(memory_format=torch.contiguous_format).view(shape)

    @staticmethod
    def setup_context(context: Any, inputs: tuple[Tensor, Sequence[int]], output: Tensor) -> None:
        context.input_shape = inputs[0].shape

    @staticmethod
    def backward(context: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad.clone(memory_format=torch.contiguous_format).view(context.input_shape), None


def reshape_copied(x: Tensor, shape: Sequence[int]) -> Tensor:
    """``x.reshape(shape)`` read from a row-major copy of ``x`` (and its gradient from a row-major copy of
    the output's): the same values, without torch deciding whether a view would do."""
    return _CopiedReshape.apply(x, shape)


def copy_permuted_merges(module: fx.GraphModule, device: torch.device) -> None:
    """``module``'s reshapes that lower the rank of a permute's output rewritten to ``reshape_copied`` (in
    place, for torch.compile); the count is added to ``module``'s ``FUSIONS``."""
    rewritten = 0
    for node in list(module.graph.nodes):
        if not _merges_permuted(node):
            continue
        source, *sizes = args_of(node)
        shape = sizes[0] if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else tuple(sizes)
        replace_with_call(module.graph, node, reshape_copied, (source, shape))
        rewritten += 1
    if rewritten:
        FUSIONS.setdefault(module, Counter())["permuted_merges_copied"] += rewritten


def _merges_permuted(node: fx.Node) -> bool:
    """Whether ``node`` reshapes a permute's (or transpose's) output to fewer axes, with no kwargs."""
    if node.op not in ("call_method", "call_function") or node.target not in _RESHAPES or node.kwargs:
        return False
    source = args_of(node)[0] if args_of(node) else None
    permuted = any(is_call(source, target) for target in _PERMUTES)
    result, before = val(node), val(source)
    return permuted and result is not None and before is not None and result.dim() < before.dim()
