"""Reshape, permute, reshape chains rewritten so that no axis merges a symbolic extent with a static one.

Attention's heads are split and merged by reshapes around a permute: ``(L, N, H * E) -> (L, N * H, E) ->
(N * H, L, E) -> (N, H, L, E)`` forward, the reverse for the gradients (nn.MultiheadAttention's export; the
permute's neighbours may be contiguous copies). With a dynamic batch ``N``, the axis ``N * H`` merges a symbol
with a static factor, and inductor indexes it with a division and a modulo by a run-time multiple of ``N`` for
every element of the loops that read it: integer divisions that cost more than the loop's work.

``refined_reshapes`` rewrites a float or integer ``reshape(permute(reshape(x, S1), P), S2)`` (``clone``s
allowed between them) whose ``S1`` has such a merged symbolic axis as ``reshape(permute(reshape(x, R), P'),
S2)``, ``R`` the common refinement of ``x``'s shape and ``S1`` (``(L, N, H, E)`` above), where ``S2`` merges
neighbours of the permuted refinement only: each axis then follows one of ``x``'s axes, static divisors only.
The values are the same: only the order of the view's indexing changes.

It runs as an inductor post-grad pass (``refined_reshapes_pass``), after the graph is differentiated, on the
package builder's programs (``training/package/programs.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import sympy
import torch
from torch import fx

from ort_torch_train.passes.match import args_of, known_val, val
from ort_torch_train.torch_internals import GraphPass, custom_graph_pass, hash_of_files

_aten = torch.ops.aten
_RESHAPES = (_aten.reshape.default, _aten.view.default, _aten._unsafe_view.default)
Extent = int | torch.SymInt


def refined_reshapes(graph: fx.Graph) -> int:
    """Rewrite ``graph``'s reshape, permute, reshape chains that merge a symbolic extent with a static one
    (module docstring); how many."""
    count = 0
    for node in list(graph.nodes):
        chain = _chain(node)
        if chain is None:
            continue
        source, inner, order = chain
        plan = _plan(known_val(source).shape, known_val(inner).shape, order, known_val(node).shape)
        if plan is None:
            continue
        refined, refined_order, same_shape = plan
        with graph.inserting_before(node):
            split = _call(graph, _aten.reshape.default, (source, refined))
            result = _call(graph, _aten.permute.default, (split, refined_order))
            if not same_shape:
                result = _call(graph, _aten.reshape.default, (result, args_of(node)[1]))
        result.meta = {**node.meta, "val": result.meta["val"]}
        node.replace_all_uses_with(result)
        _erase_unused(graph, node)
        count += 1
    return count


@functools.cache  # one instance: inductor's caches compare passes by their keys
def refined_reshapes_pass() -> GraphPass:
    """``refined_reshapes`` as an inductor post-grad pass, keyed in inductor's caches by this file's hash."""
    return custom_graph_pass("RefinedReshapes", refined_reshapes, lambda: hash_of_files((__file__,)))


def _chain(node: fx.Node) -> tuple[fx.Node, fx.Node, list[int]] | None:
    """``(x, reshape(x, S1), P)`` of a chain ``reshape(permute(reshape(x, S1), P), S2)`` ending at ``node``,
    skipping contiguous copies between them, or None."""
    if not _is_reshape(node):
        return None
    permute = _through_copies(args_of(node)[0])
    if not (isinstance(permute, fx.Node) and permute.op == "call_function" and permute.target is _aten.permute.default):
        return None
    inner = _through_copies(args_of(permute)[0])
    if not (isinstance(inner, fx.Node) and _is_reshape(inner)):
        return None
    source = _through_copies(args_of(inner)[0])
    if not isinstance(source, fx.Node) or any(val(n) is None for n in (source, inner, node)):
        return None
    return source, inner, [int(axis) for axis in args_of(permute)[1]]


def _is_reshape(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in _RESHAPES and len(node.args) == 2


def _through_copies(node: object) -> object:
    """The tensor a chain of contiguous ``clone``s starting at ``node`` copies."""
    while (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and node.target is _aten.clone.default
        and node.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format
    ):
        node = args_of(node)[0]
    return node


def _plan(
    source: Sequence[Extent], inner: Sequence[Extent], order: Sequence[int], outer: Sequence[Extent]
) -> tuple[list[int], list[int], bool] | None:
    """The refined shape (-1 for its one symbolic extent), its permutation and whether the permuted refinement
    is ``outer`` already; None where ``inner`` merges no symbolic extent with a static one, or the chain does
    not refine (two symbolic extents, a size-1 axis, ``outer`` not a merge of neighbours)."""
    source_sizes, inner_sizes, outer_sizes = (
        [_expression(extent) for extent in shape] for shape in (source, inner, outer)
    )
    if not any(_merges_symbol(size, source_sizes) for size in inner_sizes):
        return None
    refinement = _refinement(source_sizes, inner_sizes)
    if refinement is None:
        return None
    refined, groups = refinement
    refined_order = [axis for inner_axis in order for axis in groups[inner_axis]]
    permuted = [refined[axis] for axis in refined_order]
    merged = _refinement(permuted, outer_sizes)
    if merged is None or len(merged[0]) != len(permuted):
        return None
    symbolic = [axis for axis, size in enumerate(refined) if not size.is_Integer]
    if len(symbolic) > 1:
        return None
    shape = [-1 if axis in symbolic else int(size) for axis, size in enumerate(refined)]
    return shape, refined_order, permuted == outer_sizes


def _expression(extent: Extent) -> sympy.Expr:
    return extent.node.expr if isinstance(extent, torch.SymInt) else sympy.Integer(extent)


def _merges_symbol(size: sympy.Expr, source: Sequence[sympy.Expr]) -> bool:
    """Whether ``size`` is a static multiple (> 1) of a symbolic extent, and not one of ``source``'s extents."""
    coefficient, _ = size.as_coeff_Mul()
    return not size.is_Integer and coefficient != 1 and size not in source


def _refinement(
    first: Sequence[sympy.Expr], second: Sequence[sympy.Expr]
) -> tuple[list[sympy.Expr], list[list[int]]] | None:
    """The shape both ``first`` and ``second`` are merges of neighbours of, and for each of ``second``'s axes
    the refined axes it merges; None where there is none (a size-1 axis, or extents that do not divide)."""
    if any(size == 1 for size in (*first, *second)):
        return None
    refined: list[sympy.Expr] = []
    groups: list[list[int]] = [[] for _ in second]
    i = j = 0
    left, right = (first[0], second[0]) if first and second else (None, None)
    while i < len(first) and j < len(second):
        assert left is not None and right is not None
        if left == right:
            part = left
        elif _divides(left, right):
            part = left
        elif _divides(right, left):
            part = right
        else:
            return None
        groups[j].append(len(refined))
        refined.append(part)
        left, right = sympy.simplify(left / part), sympy.simplify(right / part)
        if left == 1:
            i += 1
            left = first[i] if i < len(first) else None
        if right == 1:
            j += 1
            right = second[j] if j < len(second) else None
    if i != len(first) or j != len(second):
        return None
    return refined, groups


def _divides(part: sympy.Expr, whole: sympy.Expr) -> bool:
    """Whether ``whole / part`` is an integer greater than 1."""
    ratio = sympy.simplify(whole / part)
    return bool(ratio.is_Integer and ratio > 1)


def _call(graph: fx.Graph, target: Callable[..., torch.Tensor], args: tuple) -> fx.Node:
    """A call of ``target`` on ``args`` in ``graph``, its meta value ``target`` of the arguments' meta values."""
    node = graph.call_function(target, args)
    node.meta["val"] = target(*fx.node.map_arg(args, lambda arg: val(arg)))
    return node


def _erase_unused(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node`` and the views and copies that fed only it."""
    while (
        isinstance(node, fx.Node)
        and not node.users
        and node.target in (*_RESHAPES, _aten.permute.default, _aten.clone.default)
    ):
        feeding = args_of(node)[0]
        graph.erase_node(node)
        node = feeding
