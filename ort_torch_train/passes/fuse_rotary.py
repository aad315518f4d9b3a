"""Rotary-embedding fusion: ``x * cos + cat(-x2, x1) * sin`` (Llama's ``rotate_half``) -> ``rotary_half``.

Exporters write ``rotate_half(x) * sin`` as two Slices (or a Split), a Neg, a Concat and a Mul.
Folding the sign into ``sin`` (``cat(-x2, x1) * sin == roll(x, half) * cat(-sin1, sin2)``, exact) leaves one roll and
two multiplications: bit-identical results, two ops and their backward fewer per rotation. A constant
``sin`` gets its signed copy as a new constant; a computed one gets one multiplication, shared by
every rotation that reads it.
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any

import torch
from torch import fx

from ort_torch_train.adapters import indexing, sequences
from ort_torch_train.passes.match import args_of, get_attr_target, is_call, known_val, kwargs_of, val


def rotary_half(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``signed_sin = cat(-sin1, sin2)`` over the last dim."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def fuse_rotary(module: fx.GraphModule, counts: Counter) -> None:
    """Replace every rotate-half rotation in ``module.graph`` by one ``rotary_half`` call."""
    signed: dict[fx.Node, fx.Node] = {}
    for add in list(module.graph.nodes):
        match = _rotation(add)
        if match is None:
            continue
        x, cos, sin = match
        with module.graph.inserting_before(add):
            fused = module.graph.call_function(rotary_half, (x, cos, _signed_sin(module, sin, signed)))
        fused.meta["val"] = val(add)
        add.replace_all_uses_with(fused)
        counts["rotary"] += 1
    module.graph.eliminate_dead_code()


def _rotation(add: fx.Node) -> tuple[fx.Node, Any, fx.Node] | None:
    """``(x, cos, sin)`` when ``add`` is ``x * cos + cat(-x[..., h:], x[..., :h]) * sin`` over the last dim."""
    if not is_call(add, torch.add, 2) or not all(isinstance(arg, fx.Node) for arg in args_of(add)):
        return None
    for straight, rotated in (args_of(add), args_of(add)[::-1]):
        if not (is_call(straight, torch.mul, 2) and is_call(rotated, torch.mul, 2)) or len(rotated.users) != 1:
            continue
        for concat, sin in (args_of(rotated), args_of(rotated)[::-1]):
            x = _rotate_half_source(concat)
            if x is None or not isinstance(sin, fx.Node) or x not in args_of(straight):
                continue
            cos = args_of(straight)[1] if args_of(straight)[0] is x else args_of(straight)[0]
            x_val, sin_val, add_val = val(x), val(sin), val(add)
            if x_val is None or sin_val is None or add_val is None:
                continue
            if add_val.shape != x_val.shape or sin_val.dtype != x_val.dtype:
                continue
            if sin_val.dim() == 0 or sin_val.shape[-1] != x_val.shape[-1]:
                continue
            return x, cos, sin
    return None


def _rotate_half_source(concat) -> fx.Node | None:
    """``x`` when ``concat`` is ``cat(-x[..., h:], x[..., :h], last dim)`` whose parts have no other reader."""
    if not (
        isinstance(concat, fx.Node)
        and concat.op == "call_function"
        and len(args_of(concat)) == 2
        and concat.target is indexing.concat
        and set(concat.kwargs) == {"axis"}
        and len(concat.users) == 1
    ):
        return None
    neg, first = args_of(concat)
    if not is_call(neg, torch.neg, 1) or len(neg.users) != 1:
        return None
    halves = _halves_of(first, args_of(neg)[0])
    if halves is None:
        return None
    x, axis, size = halves
    x_val = val(x)
    if x_val is None or x_val.shape[-1] != 2 * size:
        return None
    rank = x_val.dim()
    return x if {axis % rank, kwargs_of(concat)["axis"] % rank} == {rank - 1} else None


def _halves_of(first, second) -> tuple[fx.Node, int, int] | None:
    """``(x, axis, h)`` when ``first``/``second`` are ``x``'s two halves of size ``h`` along ``axis``, as two
    narrows (Slices) or the two pieces of a split (SplitToSequence), read only here."""
    if (
        not (isinstance(first, fx.Node) and isinstance(second, fx.Node))
        or len(first.users) != 1
        or len(second.users) != 1
    ):
        return None
    if _is_narrow(first) and _is_narrow(second) and args_of(first)[0] is args_of(second)[0]:
        (x, axis, start, size), (_, second_axis, second_start, second_size) = args_of(first), args_of(second)
        if axis == second_axis and (start, second_start, second_size) == (0, size, size):
            return x, axis, size
        return None
    if not (is_call(first, operator.getitem, 2) and is_call(second, operator.getitem, 2)):
        return None
    split = args_of(first)[0]
    if args_of(second)[0] is not split or (args_of(first)[1], args_of(second)[1]) != (0, 1) or len(split.users) != 2:
        return None
    if not (
        split.op == "call_function"
        and split.target is sequences.split_to_sequence
        and len(args_of(split)) == 4
        and not split.kwargs
        and args_of(split)[3] is False
    ):
        return None
    x, sizes, axis, _ = args_of(split)
    if not isinstance(x, fx.Node) or list(sizes) != [sizes[0], sizes[0]] or not isinstance(axis, int):
        return None
    return x, axis, sizes[0]


def _is_narrow(node) -> bool:
    return is_call(node, "narrow", 4) and all(isinstance(arg, int) for arg in args_of(node)[1:])


def _signed_sin(module: fx.GraphModule, sin: fx.Node, signed: dict[fx.Node, fx.Node]) -> fx.Node:
    """``cat(-sin1, sin2)`` over the last dim: a new constant for a constant ``sin``, else one multiplication."""
    if sin in signed:
        return signed[sin]
    sin_val = known_val(sin)
    half = sin_val.shape[-1] // 2
    sign = torch.ones(sin_val.shape[-1], dtype=sin_val.dtype)
    sign[:half] = -1
    graph = module.graph
    if sin.op == "get_attr":
        owner_name, _, name = get_attr_target(sin).rpartition(".")
        owner = module.get_submodule(owner_name)
        value = getattr(owner, name)
        new_name = f"{name}_signed"
        while hasattr(owner, new_name):
            new_name += "_"
        owner.register_buffer(new_name, value * sign.to(value.device))
        with graph.inserting_after(sin):
            node = graph.get_attr(f"{owner_name}.{new_name}" if owner_name else new_name)
    else:
        sign_name = "rotary_sign"
        while hasattr(module, sign_name):
            sign_name += "_"
        module.register_buffer(sign_name, sign.to(sin_val.device if sin_val.device.type != "meta" else "cpu"))
        with graph.inserting_after(sin):
            sign_node = graph.get_attr(sign_name)
        with graph.inserting_after(sign_node):
            node = graph.call_function(torch.mul, (sin, sign_node))
        sign_node.meta["val"] = torch.empty(sign.shape, dtype=sign.dtype, device="meta")
    node.meta["val"] = sin_val
    signed[sin] = node
    return node
