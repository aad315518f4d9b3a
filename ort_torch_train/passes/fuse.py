"""Fusion passes over a converted graph: exported op sequences back into the torch calls they came from.

* ``matmul(x, W.permute(1, 0)) [+ b]`` -> ``F.linear(x, W[, b])`` (legacy and dynamo exporters
  write nn.Linear on 3-D inputs this way).
* ``softmax((q [* s1]) @ (kT [* s2]) [* s3 | / s3] [+ mask], -1) @ v`` ->
  ``F.scaled_dot_product_attention(q, k, v, mask, scale=s1*s2*s3)`` (what nn.MultiheadAttention and
  F.scaled_dot_product_attention are exported as); also with ``where(constant, -inf, scores)``
  (``masked_fill``) in place of the additive mask, which becomes a boolean mask. A scale is a Python
  number or a one-element constant computed from constants only (the dynamo exporter writes
  ``sqrt(1 / sqrt(E))`` on q and on k before the transpose); it is folded into SDPA's ``scale``. A
  causal mask (``-inf`` or the dtype's lowest value above the diagonal) becomes ``is_causal=True``. torch's fused
  attention kernel replaces the unfused sequence, whose per-op cost dominates short sequences.

Then (other files): norms, GELU and SiLU (``fuse_patterns.py``), rotary embedding (``fuse_rotary.py``),
view chains (``fuse_views.py``) and large float32 linears pointed at oneDNN (``onednn_linear.py``).

All keep autograd exact up to float rounding. Nodes carry ``meta["val"]`` (a meta tensor) from
the conversion loop; a pattern whose shapes are unknown is left alone.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.passes.fuse_patterns import fuse_patterns
from ort_torch_train.passes.fuse_rotary import fuse_rotary
from ort_torch_train.passes.fuse_views import fuse_views
from ort_torch_train.passes.match import args_of, constants_of, get_attr_target, known_val
from ort_torch_train.passes.match import is_call as _is_call
from ort_torch_train.passes.match import only_user as _only_user
from ort_torch_train.passes.match import val as _val
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.onednn_linear import use_onednn_linear


def fuse_graph(module: fx.GraphModule) -> Counter:
    """Apply every fusion to ``module.graph`` in place, then drop what became dead (no recompile).

    Returns how many of each fusion fired (also kept as ``module``'s ``FUSIONS``).
    """
    counts: Counter = Counter()
    fuse_patterns(module, counts)
    fuse_rotary(module, counts)
    counts["linear"] = _fuse_linear(module.graph)
    counts["attention"] = _fuse_attention(module)
    module.graph.eliminate_dead_code()
    fuse_views(module.graph, counts)
    module.graph.eliminate_dead_code()
    _drop_unused_constants(module)
    counts["onednn_linear"] = use_onednn_linear(module)
    FUSIONS.set(module, +counts)
    return +counts


def _drop_unused_constants(module: fx.GraphModule) -> None:
    constants = getattr(module, "constants", None)
    if constants is None:
        return
    used = {node.target for node in module.graph.nodes if node.op == "get_attr"}
    for name in list(constants._buffers):
        if f"constants.{name}" not in used:
            del constants._buffers[name]


# Linear -------------------------------------------------------------------------------------------
def _fuse_linear(graph: fx.Graph) -> int:
    fused = 0
    for matmul in list(graph.nodes):
        if not _is_call(matmul, torch.matmul, 2):
            continue
        x, transposed = args_of(matmul)
        if not (_is_call(transposed, "permute", 2) and tuple(args_of(transposed)[1]) == (1, 0)):
            continue
        weight = args_of(transposed)[0]
        weight_val, x_val = _val(weight), _val(x)
        if weight_val is None or x_val is None or x_val.dim() < 1 or x_val.dtype != weight_val.dtype:
            continue
        if not weight_val.is_floating_point():
            continue
        add = _only_user(matmul)
        bias = _bias_of(add, matmul, weight_val)
        target = add if add is not None and bias is not None else matmul
        with graph.inserting_before(target):
            linear = graph.call_function(F.linear, (x, weight) if bias is None else (x, weight, bias))
        linear.meta["val"] = _val(target)
        target.replace_all_uses_with(linear)
        fused += 1
    return fused


def _bias_of(add: fx.Node | None, matmul: fx.Node, weight_val: torch.Tensor) -> fx.Node | None:
    """The 1-D bias that ``add`` adds to ``matmul``'s result, or None."""
    if add is None or not _is_call(add, torch.add, 2) or matmul not in args_of(add):
        return None
    bias = args_of(add)[1] if args_of(add)[0] is matmul else args_of(add)[0]
    bias_val = _val(bias)
    if bias is matmul or bias_val is None or bias_val.dtype != weight_val.dtype:
        return None
    return bias if tuple(bias_val.shape) == (weight_val.shape[0],) else None


# Attention ----------------------------------------------------------------------------------------
def _fuse_attention(module: fx.GraphModule) -> int:
    graph = module.graph
    count = 0
    for softmax in list(graph.nodes):
        if not _is_call(softmax, torch.softmax, 2):
            continue
        scores_val = _val(softmax)
        if scores_val is None or scores_val.dim() < 3 or args_of(softmax)[1] != scores_val.dim() - 1:
            continue
        read = _probabilities_reader(module, softmax)
        parts = None if read is None else _attention_parts(module, args_of(softmax)[0])
        if read is None or parts is None:
            continue
        output, guarded = read
        query, key_transposed, mask, scale, key_scaled = parts
        if guarded and mask is not None and not _attends_somewhere(module, mask):
            continue
        value = args_of(output)[1]
        if not _same_batch(scores_val, query, key_transposed, value):
            continue
        with graph.inserting_before(output):
            key = _untransposed(graph, key_transposed)
            key = _unscaled(module, key) if key_scaled else key
            causal = mask is not None and _is_causal(module, mask, scores_val)
            args = (query, key, value) if mask is None or causal else (query, key, value, mask)
            kwargs = {"scale": scale, "is_causal": True} if causal else {"scale": scale}
            fused = graph.call_function(F.scaled_dot_product_attention, args, kwargs)
        fused.meta["val"] = _val(output)
        output.replace_all_uses_with(fused)
        count += 1
    return count


def _probabilities_reader(module: fx.GraphModule, softmax: fx.Node) -> tuple[fx.Node, bool] | None:
    """The ``matmul(probabilities, v)`` reading the softmax, directly or through the NaN guard that
    torch's exporter writes after it (``where(isnan(p), 0, p)``: a row masked everywhere gives zeros),
    and whether it is guarded; None for any other use."""
    users = list(softmax.users)
    guards = [user for user in users if _is_call(user, torch.where, 3)]
    reader = softmax
    if len(users) == 2 and len(guards) == 1:
        reader = guards[0]
        condition, zero, probabilities = args_of(reader)
        is_nan = _is_call(condition, torch.isnan, 1) and args_of(condition)[0] is softmax
        if not (is_nan and condition in users and probabilities is softmax and _scalar_value(module, zero) == 0.0):
            return None
    elif len(users) != 1:
        return None
    output = _only_user(reader)
    if not (_is_call(output, torch.matmul, 2) and args_of(output)[0] is reader):
        return None
    return output, reader is not softmax


def _attends_somewhere(module: fx.GraphModule, mask: fx.Node) -> bool:
    """Whether a constant mask lets every query attend to at least one position (then the NaN guard
    never fires, and SDPA, which has none, gives the same result)."""
    value = _constant(module, mask)
    if value is None:
        return False
    attends = value if value.dtype == torch.bool else value != -torch.inf
    return bool(attends.any(-1).all())


def _is_causal(module: fx.GraphModule, mask: fx.Node, scores_val: torch.Tensor) -> bool:
    """Whether a constant mask is exactly the causal one (lower triangle attends, square scores):
    then SDPA runs with ``is_causal=True``, which flash attention accepts and a mask tensor is not."""
    value = _constant(module, mask)
    length = scores_val.shape[-1]
    if value is None or scores_val.shape[-2] != length or value.shape[-2:] != (length, length):
        return False
    lower = torch.ones(length, length, dtype=torch.bool).tril()
    if value.dtype == torch.bool:
        return bool(torch.equal(value, lower.expand_as(value)))
    if not value.is_floating_point():
        return False
    # the dtype's lowest value masks as -inf does: exp(lowest + score - max) is 0 for any finite scores
    masked = (value == -torch.inf) | (value == torch.finfo(value.dtype).min)
    return bool(torch.equal(masked, (~lower).expand_as(value)) and torch.all(value[~masked] == 0))


def _attention_parts(module: fx.GraphModule, scores: fx.Node):
    """(query, key transposed, mask or None, scale) of the softmax input, or None."""
    mask = None
    if _is_call(scores, torch.where, 3) and len(scores.users) == 1:
        found = _where_mask(module, scores)
        if found is None:
            return None
        mask, scores = found
    elif _is_call(scores, torch.add, 2) and len(scores.users) == 1:
        scored = [arg for arg in args_of(scores) if _leads_to_matmul(module, arg)]
        if len(scored) != 1:
            return None
        mask = args_of(scores)[1] if args_of(scores)[0] is scored[0] else args_of(scores)[0]
        mask_val = _val(mask)
        if mask_val is None or not mask_val.is_floating_point():
            return None
        scores = scored[0]
    scale = 1.0
    factor = _scalar_factor(module, scores)
    if factor is not None:
        scale, scores = factor, _unscaled(module, scores)
    if not (_is_call(scores, torch.matmul, 2) and len(scores.users) == 1):
        return None
    query, key_transposed = args_of(scores)
    for operand in (query, key_transposed):
        factor = _scalar_factor(module, operand)
        if factor is not None:
            scale *= factor
    query = _unscaled(module, query) if _scalar_factor(module, query) is not None else query
    if _scalar_factor(module, key_transposed) is not None:
        key_transposed = _unscaled(module, key_transposed)
    key = _transpose_input(key_transposed)
    factor = None if key is None or len(key_transposed.users) != 1 else _scalar_factor(module, key)
    if factor is not None:  # (k * s).transpose(-2, -1)
        scale *= factor
    return query, key_transposed, mask, scale, factor is not None


def _where_mask(module: fx.GraphModule, where: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """For ``where(c, -inf, scores)`` / ``where(c, scores, -inf)`` with a constant ``c``: the boolean
    mask of the positions that attend (a new constant) and ``scores``; else None."""
    condition, if_true, if_false = args_of(where)
    condition_value = _constant(module, condition)
    if condition_value is None or condition_value.dtype != torch.bool:
        return None
    for fill, scores, attend in ((if_true, if_false, ~condition_value), (if_false, if_true, condition_value)):
        fill_value = _constant(module, fill)
        if fill_value is not None and _leads_to_matmul(module, scores) and bool(torch.all(fill_value == -torch.inf)):
            constants = constants_of(module)
            name = f"attention_mask{len(constants._buffers)}"
            constants.register_buffer(name, attend.contiguous())
            with module.graph.inserting_before(where):
                mask = module.graph.get_attr(f"constants.{name}")
            mask.meta["val"] = attend.to("meta")
            return mask, scores
    return None


def _constant(module: fx.GraphModule, node) -> torch.Tensor | None:
    """The value of a constant buffer, possibly cast with ``.to(dtype)``; None for anything else."""
    if _is_call(node, "to", 2) and isinstance(args_of(node)[1], torch.dtype):
        value = _constant(module, args_of(node)[0])
        return None if value is None else value.to(args_of(node)[1])
    if isinstance(node, fx.Node) and node.op == "get_attr":
        return module.get_buffer(get_attr_target(node))
    return None


def _leads_to_matmul(module: fx.GraphModule, node) -> bool:
    """Whether ``node`` is a single-use matmul, possibly scaled by a constant."""
    if _scalar_factor(module, node) is not None:
        node = _unscaled(module, node)
    return _is_call(node, torch.matmul, 2) and len(node.users) == 1


def _scalar_factor(module: fx.GraphModule, node) -> float | None:
    """``c`` for a single-use ``mul(x, c)`` or ``mul(c, x)`` (``1/c`` for ``div(x, c)``) with a constant scalar ``c``."""
    if not isinstance(node, fx.Node) or len(node.users) != 1 or len(args_of(node)) != 2 or node.kwargs:
        return None
    if not (_is_call(node, torch.mul) or _is_call(node, torch.div)):
        return None
    candidates = args_of(node)[1:] if _is_call(node, torch.div) else args_of(node)[::-1]
    for constant in candidates:
        other = args_of(node)[0] if constant is args_of(node)[1] else args_of(node)[1]
        value = _scalar_value(module, constant)
        if value is None or not isinstance(other, fx.Node) or _scalar_value(module, other) is not None:
            continue
        if _is_call(node, torch.mul):
            return value
        return 1.0 / value if value != 0.0 else None
    return None


def _unscaled(module: fx.GraphModule, node: fx.Node) -> fx.Node:
    """The tensor operand of a ``mul``/``div`` by a constant scalar."""
    first, second = args_of(node)
    return first if _scalar_value(module, second) is not None else second


_SCALAR_FUNCTIONS = (
    torch.sqrt,
    torch.rsqrt,
    torch.reciprocal,
    torch.div,
    torch.mul,
    torch.add,
    torch.sub,
    torch.neg,
    torch.pow,
)
_SCALAR_METHODS = ("to", "reshape", "squeeze", "unsqueeze", "float")


def _scalar_value(module: fx.GraphModule, node, depth: int = 0) -> float | None:
    """A Python number, or a one-element tensor computed from constant buffers and numbers only by
    arithmetic and casts, as a float; None for anything else."""
    value = _constant_expression(module, node, depth)
    if isinstance(value, torch.Tensor):
        return float(value) if value.numel() == 1 and value.is_floating_point() else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _constant_expression(module: fx.GraphModule, node, depth: int):
    if not isinstance(node, fx.Node):
        return node if isinstance(node, (int, float, torch.dtype)) else None
    if depth > 8:
        return None
    if node.op == "get_attr":
        try:
            value = module.get_buffer(get_attr_target(node))  # a constant; parameters are not buffers
        except AttributeError:
            return None
        return value if value.numel() == 1 else None
    known = (node.op == "call_function" and node.target in _SCALAR_FUNCTIONS) or (
        node.op == "call_method" and node.target in _SCALAR_METHODS
    )
    if not known or node.kwargs:
        return None
    values = [_constant_expression(module, arg, depth + 1) for arg in args_of(node)]
    if any(value is None for value in values) or not isinstance(values[0], torch.Tensor) and node.op == "call_method":
        return None
    target = node.target
    try:
        result = target(*values) if callable(target) else getattr(values[0], target)(*values[1:])
    except (TypeError, RuntimeError):  # e.g. torch.sqrt of a Python number
        return None
    return result if not isinstance(result, torch.Tensor) or result.numel() == 1 else None


def _same_batch(scores_val: torch.Tensor, query, key_transposed, value) -> bool:
    """q (..., L, E), kT (..., E, S), v (..., S, Ev): same rank and batch dims, floating point."""
    q, kt, v = (_val(node) for node in (query, key_transposed, value))
    if any(val is None or val.dim() != scores_val.dim() or not val.is_floating_point() for val in (q, kt, v)):
        return False
    assert q is not None and kt is not None and v is not None
    batch = scores_val.shape[:-2]
    return (
        q.shape[:-2] == kt.shape[:-2] == v.shape[:-2] == batch
        and q.shape[-1] == kt.shape[-2]
        and kt.shape[-1] == v.shape[-2]
        and q.dtype == kt.dtype == v.dtype == scores_val.dtype
    )


def _transpose_input(node) -> fx.Node | None:
    """``x`` for a permute or transpose of ``x`` that swaps (only) its last two dimensions, else None."""
    node_val = _val(node)
    if node_val is None or not isinstance(node, fx.Node) or not args_of(node):
        return None
    rank = node_val.dim()
    swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    if _is_call(node, "permute", 2) and tuple(args_of(node)[1]) == swap:
        return args_of(node)[0]
    if _is_call(node, "transpose", 3) and {d % rank for d in args_of(node)[1:]} == {rank - 2, rank - 1}:
        return args_of(node)[0]
    return None


def _untransposed(graph: fx.Graph, key_transposed: fx.Node) -> fx.Node:
    """The key (..., S, E): the input of a last-two-dims permute or transpose, else a new transpose node."""
    key = _transpose_input(key_transposed)
    if key is not None:
        return key
    node = graph.call_method("transpose", (key_transposed, -2, -1))
    node.meta["val"] = known_val(key_transposed).transpose(-2, -1)
    return node
