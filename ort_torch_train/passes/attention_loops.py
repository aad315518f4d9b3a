"""CPU flash attention's calls at tiny sizes rewritten as products and sums, which inductor compiles into its loops.

A differentiated graph calls ``_scaled_dot_product_flash_attention_for_cpu`` and its backward as extern kernels.
At a tiny transformer's sizes (a few positions, heads of 8 or 16 values) those kernels run a few small GEMMs
per head and batch, each dearer to call than its work. ``attention_loops`` rewrites each call without
dropout, mask or causal masking whose queries times keys per head are at most ``MAX_SCORES`` as broadcast
products summed over one axis, the softmax written out; the backward recomputes the probabilities from the
forward's log-sum-exp, as the flash kernel does. Results agree with the kernels' to float32 rounding (another
summation order).

It runs as an inductor post-grad pass (``attention_loops_pass``) on the package builder's programs
(``training/package/programs.py``); ``compile=True``'s graphs get the same choice before differentiation
(``small_attention.py``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import sympy
import torch
from torch import fx

from ort_torch_train.passes.match import args_of, known_val, kwargs_of, val
from ort_torch_train.passes.small_attention import MAX_SCORES
from ort_torch_train.torch_internals import GraphPass, custom_graph_pass, hash_of_files

_aten = torch.ops.aten
_FORWARD = _aten._scaled_dot_product_flash_attention_for_cpu.default
_BACKWARD = _aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_TERM_AXES = (0, 1, 2, 4)  # the output's axes among its terms' (batch, head, query, key, value)
_REWRITTEN = "attention_loops"  # the meta key marking the nodes a rewrite inserted


def attention_loops(graph: fx.Graph) -> int:
    """Rewrite ``graph``'s small CPU flash attention calls, forward and backward (module docstring); how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (_FORWARD, _BACKWARD) or not _plain_and_small(node):
            continue
        if any(user.target is not operator.getitem for user in node.users):
            continue
        with graph.inserting_before(node):
            results = _forward(graph, node) if node.target is _FORWARD else _backward(graph, node)
        for user in list(node.users):
            result = results[args_of(user)[1]]
            result.meta = {**user.meta, "val": result.meta["val"]}
            user.replace_all_uses_with(result)
            graph.erase_node(user)
        graph.erase_node(node)
        for result in results:
            if not result.users:
                _erase_unused(graph, result)
        count += 1
    return count


@functools.cache  # one instance per argument: inductor's caches compare passes by their keys
def attention_loops_pass(then: GraphPass | None = None) -> GraphPass:
    """``attention_loops`` as an inductor post-grad pass, followed by the inductor pass ``then`` where given;
    keyed in inductor's caches by this file's hash and ``then``'s key."""

    def apply(graph: fx.Graph) -> None:
        attention_loops(graph)
        if then is not None:
            then(graph)

    def uuid() -> bytes:
        key = hash_of_files((__file__,))
        return key if then is None else key + then.uuid()

    return custom_graph_pass("AttentionLoops", apply, uuid)


def _plain_and_small(node: fx.Node) -> bool:
    """Whether ``node``'s attention is float32, without dropout, mask or causal masking, one key and value head
    per query head, with at most ``MAX_SCORES`` static queries times keys per head."""
    args = args_of(node)
    # the backward's arguments start with the output's gradient, and the output and log-sum-exp follow value
    first, dropout_position = (0, 3) if node.target is _FORWARD else (1, 6)
    dropout = _argument(node, dropout_position, "dropout_p", 0.0)
    causal = _argument(node, dropout_position + 1, "is_causal", False)
    if dropout != 0 or causal or node.kwargs.get("attn_mask") is not None:
        return False
    query_val, key_val, value_val = (val(arg) for arg in args[first : first + 3])
    if query_val is None or key_val is None or value_val is None or query_val.dtype != torch.float32:
        return False
    if not query_val.dim() == key_val.dim() == value_val.dim() == 4:
        return False
    # one key and value head per query head (grouped heads reach the kernel repeated, but not always)
    heads = [[_expression(size) for size in tensor.shape[:2]] for tensor in (query_val, key_val, value_val)]
    if heads[1] != heads[0] or heads[2] != heads[0]:
        return False
    positions = (query_val.shape[-2], key_val.shape[-2])
    return all(isinstance(size, int) for size in positions) and positions[0] * positions[1] <= MAX_SCORES


def _argument(node: fx.Node, position: int, name: str, default: object) -> object:
    """``node``'s argument ``name``, given at ``position`` or by name, else ``default``."""
    args = args_of(node)
    return args[position] if position < len(args) else node.kwargs.get(name, default)


def _scale(node: fx.Node, query: fx.Node) -> float:
    """The call's scale of the scores: its ``scale``, else one over the root of the head's size."""
    scale = kwargs_of(node).get("scale")
    return float(known_val(query).shape[-1]) ** -0.5 if scale is None else float(scale)


def _forward(graph: fx.Graph, node: fx.Node) -> tuple[fx.Node, fx.Node]:
    """``(output, logsumexp)`` of the forward call ``node`` as products and sums."""
    query, key, value = args_of(node)[:3]
    call = functools.partial(_call, graph)
    scores = _scores(graph, query, key, _scale(node, query))
    largest = call(_aten.amax.default, (scores, [-1], True))
    exponentials = call(_aten.exp.default, (call(_aten.sub.Tensor, (scores, largest)),))
    total = call(_aten.sum.dim_IntList, (exponentials, [-1], True))
    probabilities = call(_aten.div.Tensor, (exponentials, total))
    # summed in the layout the kernel gives its output (which later views of it may depend on)
    order = _physical_order(node)
    terms = call(_aten.mul.Tensor, (call(_aten.unsqueeze.default, (probabilities, -1)), _unsqueeze(graph, value, -3)))
    physical = call(_aten.permute.default, (terms, [_TERM_AXES[axis] for axis in order] + [3]))  # keys last
    inverse = sorted(range(len(order)), key=order.__getitem__)
    output = call(_aten.permute.default, (call(_aten.sum.dim_IntList, (physical, [-1])), inverse))
    logsumexp = call(_aten.add.Tensor, (largest, call(_aten.log.default, (total,))))
    return output, call(_aten.squeeze.dim, (logsumexp, -1))


def _physical_order(node: fx.Node) -> list[int]:
    """The output's axes of the forward call ``node`` from the outermost in memory to the innermost (a dense
    layout's: each axis's stride the product of the sizes inside it); the logical order where it is not dense."""
    output = node.meta["val"][0]
    sizes, strides = [_expression(size) for size in output.shape], [_expression(stride) for stride in output.stride()]
    inner: list[int] = []
    product: sympy.Expr = sympy.Integer(1)
    while len(inner) < len(sizes):
        axis = next((a for a in range(len(sizes)) if a not in inner and strides[a] == product), None)
        if axis is None:
            return list(range(len(sizes)))
        inner.append(axis)
        product = sympy.expand(product * sizes[axis])
    return inner[::-1]


def _expression(extent: int | torch.SymInt) -> sympy.Expr:
    return sympy.expand(extent.node.expr) if isinstance(extent, torch.SymInt) else sympy.Integer(extent)


def _backward(graph: fx.Graph, node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node]:
    """``(grad_query, grad_key, grad_value)`` of the backward call ``node`` as products and sums."""
    grad, query, key, value, output, logsumexp = args_of(node)[:6]
    call = functools.partial(_call, graph)
    scale = _scale(node, query)
    scores = _scores(graph, query, key, scale)
    probabilities = call(_aten.exp.default, (call(_aten.sub.Tensor, (scores, _unsqueeze(graph, logsumexp, -1))),))
    weights = call(_aten.unsqueeze.default, (probabilities, -1))  # (..., L, S, 1)
    grad_rows = _unsqueeze(graph, grad, -2)  # (..., L, 1, E)
    grad_value = call(_aten.sum.dim_IntList, (call(_aten.mul.Tensor, (weights, grad_rows)), [-3]))
    grad_probabilities = call(
        _aten.sum.dim_IntList, (call(_aten.mul.Tensor, (grad_rows, _unsqueeze(graph, value, -3))), [-1])
    )
    row_terms = call(_aten.sum.dim_IntList, (call(_aten.mul.Tensor, (grad, output)), [-1], True))
    grad_scores = call(_aten.mul.Tensor, (probabilities, call(_aten.sub.Tensor, (grad_probabilities, row_terms))))
    scaled = call(_aten.unsqueeze.default, (call(_aten.mul.Tensor, (grad_scores, scale)), -1))  # (..., L, S, 1)
    grad_query = call(_aten.sum.dim_IntList, (call(_aten.mul.Tensor, (scaled, _unsqueeze(graph, key, -3))), [-2]))
    grad_key = call(_aten.sum.dim_IntList, (call(_aten.mul.Tensor, (scaled, _unsqueeze(graph, query, -2))), [-3]))
    return grad_query, grad_key, grad_value


def _scores(graph: fx.Graph, query: fx.Node, key: fx.Node, scale: float) -> fx.Node:
    """``query @ key^T * scale`` as a broadcast product summed over the head's values."""
    terms = _call(graph, _aten.mul.Tensor, (_unsqueeze(graph, query, -2), _unsqueeze(graph, key, -3)))
    return _call(graph, _aten.mul.Tensor, (_call(graph, _aten.sum.dim_IntList, (terms, [-1])), scale))


def _unsqueeze(graph: fx.Graph, node: fx.Node, axis: int) -> fx.Node:
    return _call(graph, _aten.unsqueeze.default, (node, axis))


def _call(graph: fx.Graph, target: Callable[..., torch.Tensor], args: tuple) -> fx.Node:
    """A call of ``target`` on ``args`` in ``graph``, its meta value ``target`` of the arguments' meta values."""
    node = graph.call_function(target, args)
    node.meta["val"] = target(*fx.node.map_arg(args, lambda arg: val(arg)))
    node.meta[_REWRITTEN] = True
    return node


def _erase_unused(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node``, a rewrite's node left unused, and the rewrite's nodes that fed only it."""
    pending = [node]
    while pending:
        current = pending.pop()
        if current.users or not current.meta.get(_REWRITTEN):
            continue
        pending.extend(current.all_input_nodes)
        graph.erase_node(current)
