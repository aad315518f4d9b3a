"""Small matrix products written as a broadcast multiply and a sum, which inductor compiles into its own loops.

A compiled program calls each ``mm``/``addmm`` as an extern kernel: on a tiny model the call's tensor handles,
its output's allocation and the dispatcher behind it cost more than the product itself. ``small_products``
rewrites a float32 ``mm(a, b)`` (``addmm(bias, a, b)``: the same and an add) as ``(a[:, :, None] * b[None]).sum(1)``
where the product is small: at most one of its three extents (rows, contraction, columns) is symbolic (a dynamic
batch, or a multiple of one: the tokens of a fixed-length sequence) and its multiply-adds per unit of that
extent (all extents static: in all) are at most ``MAX_STATIC_EXTENTS``. Inductor fuses the multiply and sum with the
operations around them into loops that need no output of their own; past the limit its loops cost more than the
GEMM's call saves. Results agree with the extern GEMM's to float32 rounding (a different summation order).

It runs as an inductor post-grad pass (``small_products_pass``), on the differentiated graph: in the package
builder's programs (``training/package/programs.py``) and before ``onednn_linear.cpu_matmuls`` in ``compile=True``'s
CPU graphs (``training/compile/settings.py``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import fx

from ort_torch_train.passes.match import args_of, val
from ort_torch_train.torch_internals import GraphPass, custom_graph_pass, hash_of_files

# the static extents' product up to which a product is rewritten (bench/experiments/small_products.py)
MAX_STATIC_EXTENTS = 256

_aten = torch.ops.aten


def small_products(
    graph: fx.Graph, max_static_extents: int = MAX_STATIC_EXTENTS, symbolic_contraction: bool = True
) -> int:
    """Rewrite ``graph``'s small float32 ``mm``/``addmm`` (module docstring) as a multiply and a sum; how many.
    ``symbolic_contraction=False`` leaves the products that sum over a symbolic extent (a weight's gradient, summed
    over the batch): inductor guards that such a sum is not over one element, so a compiled graph would compile
    again for a batch of 1."""
    count = 0
    for node in list(graph.nodes):
        operands = _operands(node)
        if operands is None or not _small(operands[0], operands[1], max_static_extents, symbolic_contraction):
            continue
        a, b, bias = operands
        with graph.inserting_before(node):
            left = _call(graph, _aten.unsqueeze.default, (a, 2))
            right = _call(graph, _aten.unsqueeze.default, (b, 0))
            terms = _call(graph, _aten.mul.Tensor, (left, right))
            product = _call(graph, _aten.sum.dim_IntList, (terms, [1]))
            if bias is not None:
                product = _call(graph, _aten.add.Tensor, (product, bias))
        product.meta = {**node.meta, "val": product.meta["val"]}
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        count += 1
    return count


@functools.cache  # one instance per arguments: compiled steps' keys and inductor's caches compare them
def small_products_pass(
    max_static_extents: int = MAX_STATIC_EXTENTS, then: GraphPass | None = None, symbolic_contraction: bool = True
) -> GraphPass:
    """``small_products`` as an inductor post-grad pass (after the graph is differentiated, so that backward's
    products are rewritten too), followed by the inductor pass ``then`` where given; keyed in inductor's caches by
    this file's hash, the limit, ``symbolic_contraction`` and ``then``'s key."""

    def apply(graph: fx.Graph) -> None:
        small_products(graph, max_static_extents, symbolic_contraction)
        if then is not None:
            then(graph)

    def uuid() -> bytes:
        key = hash_of_files((__file__,)) + f"{max_static_extents}:{symbolic_contraction}".encode()
        return key if then is None else key + then.uuid()

    return custom_graph_pass("SmallProducts", apply, uuid)


def _call(graph: fx.Graph, target: Callable[..., torch.Tensor], args: tuple) -> fx.Node:
    """A call of ``target`` on ``args`` in ``graph``, its meta value ``target`` of the arguments' meta values."""
    node = graph.call_function(target, args)
    node.meta["val"] = target(*(val(arg) if isinstance(arg, fx.Node) else arg for arg in args))
    return node


def _small(a: fx.Node, b: fx.Node, max_static_extents: int, symbolic_contraction: bool) -> bool:
    """Whether the product's multiply-adds per unit of its one symbolic extent (all static: in all) are at most
    ``max_static_extents``: a symbolic extent counts its static factor (6 for ``6 * batch``: the rows of a
    sequence of 6 per sample); two symbolic extents, or one of two symbols, are never small; with ``symbolic_contraction=False``
    neither is a symbolic contraction."""
    a_val, b_val = val(a), val(b)
    assert a_val is not None and b_val is not None
    extents: list[int | torch.SymInt] = [a_val.shape[0], a_val.shape[1], b_val.shape[1]]
    if not symbolic_contraction and not isinstance(extents[1], int):
        return False
    static = [extent for extent in extents if isinstance(extent, int)]
    if len(static) < 2:
        return False
    work = math.prod(static)
    for extent in extents:
        if not isinstance(extent, int):
            factor = _static_factor(extent)
            if factor is None:
                return False
            work *= factor
    return work <= max_static_extents


def _static_factor(extent: torch.SymInt) -> int | None:
    """``c`` for a symbolic extent ``c * s`` of one symbol ``s`` (1 for ``s`` itself), else None."""
    coefficient, rest = extent.node.expr.as_coeff_Mul()
    return int(coefficient) if coefficient.is_Integer and rest.is_Symbol else None


def _operands(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None] | None:
    """``(a, b, bias)`` of a float32 CPU ``mm(a, b)``, or ``addmm(bias, a, b)`` with no scaling."""
    if node.op != "call_function" or node.target not in (_aten.mm.default, _aten.addmm.default):
        return None
    if node.target is _aten.mm.default:
        (a, b), bias = args_of(node), None
    else:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 3:
            return None
        bias, a, b = args_of(node)
    values = [val(arg) for arg in (a, b, bias) if arg is not None]
    if not all(value is not None and value.dtype == torch.float32 and value.device.type == "cpu" for value in values):
        return None
    return a, b, bias
