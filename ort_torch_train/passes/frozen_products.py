"""Matrix products with a frozen low-precision operand, upcast again for backward in compiled graphs.

A frozen bfloat16/float16 weight (LoRA's ``frozen_dtype``) reaches its matrix product through a Cast
to float32. In a compiled step the product's backward (the gradient of its other operand) reads that
float32 copy, so the compiled graph keeps every frozen weight's copy from forward to backward: more
memory than float32 weights would take. ``products_upcast_twice`` rewrites each such product
(``torch.matmul``, ``F.linear``, Gemm) as a ``FrozenProduct``: forward upcasts the weight for the call
only, and backward upcasts it again from the low-precision weight. Both casts go through
``upcast_after``, an op that waits for the product's other operand (forward) or its incoming gradient
(backward): plain casts of graph inputs are fused by inductor into one kernel at the graph's start,
which holds every copy at once.
The eager counterpart is ``frozen_upcasts.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx

from ort_torch_train.adapters.linear import gemm, gemm_without_c
from ort_torch_train.convert.meta_keys import INPUT_REQUIRES_GRAD
from ort_torch_train.passes.frozen_upcasts import upcasts_input
from ort_torch_train.passes.match import args_of, kwargs_of, val
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.onednn_linear import LINEARS


@torch.library.custom_op("ort_torch_train::upcast_after", mutates_args=())
def upcast_after(source: Tensor, after: Tensor, dtype: torch.dtype) -> Tensor:
    """``source.to(dtype)``, computed once ``after`` exists (the order a compiled graph runs it in)."""
    return source.to(dtype)


@upcast_after.register_fake
def _(source: Tensor, after: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.empty_like(source, dtype=dtype)


class FrozenProduct(torch.autograd.Function):
    """``kind``'s product of ``x`` and ``weight.to(dtype)`` (``bias`` added as the product adds it), for a
    frozen ``weight``: backward saves the low-precision ``weight`` and upcasts it again.

    ``kind``: "matmul" (``x @ w``), "linear" (``x @ w.T + bias``) or "gemm" (``alpha * x @ op(w) + beta * bias``,
    op a transpose with ``transposed``).
    """

    @staticmethod
    def forward(
        x: Tensor, weight: Tensor, bias: Tensor | None, kind: str, transposed: bool, alpha: float, beta: float
    ) -> Tensor:
        upcast = upcast_after(weight, x.detach(), x.dtype)  # not with the other weights' casts, at the start
        if kind == "matmul":
            return torch.matmul(x, upcast)
        if kind == "linear":
            return F.linear(x, upcast, bias)
        if bias is None:
            return gemm_without_c(x, upcast, alpha=alpha, trans_a=False, trans_b=transposed)
        return gemm(x, upcast, bias, alpha=alpha, beta=beta, trans_a=False, trans_b=transposed)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        x, weight, bias, kind, transposed, alpha, beta = inputs
        ctx.save_for_backward(weight)
        ctx.dtype, ctx.bias_shape = x.dtype, None if bias is None else bias.shape
        # the product's weight as x @ w: transposed for F.linear and a transposing Gemm
        ctx.right_transposed = kind == "linear" or (kind == "gemm" and transposed)
        ctx.alpha, ctx.beta = (alpha, beta) if kind == "gemm" else (1.0, 1.0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (weight,) = ctx.saved_tensors
        if ctx.needs_input_grad[1]:
            raise RuntimeError(f"FrozenProduct: its {weight.dtype} weight of shape {list(weight.shape)} is not frozen")
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            upcast = upcast_after(weight, grad.detach(), ctx.dtype)
            grad_x = torch.matmul(grad, upcast if ctx.right_transposed else upcast.t())
            grad_x = grad_x if ctx.alpha == 1.0 else grad_x * ctx.alpha
        if ctx.needs_input_grad[2]:
            grad_bias = grad.sum_to_size(ctx.bias_shape)
            grad_bias = grad_bias if ctx.beta == 1.0 else grad_bias * ctx.beta
        return grad_x, None, grad_bias, None, None, None, None


def frozen_product(
    x: Tensor, weight: Tensor, bias: Tensor | None, kind: str, transposed: bool, alpha: float, beta: float
) -> Tensor:
    """``FrozenProduct`` applied (a plain function, for the graph's call nodes)."""
    return FrozenProduct.apply(x, weight, bias, kind, transposed, alpha, beta)


def products_upcast_twice(module: fx.GraphModule, device: torch.device) -> None:
    """Each matrix product whose weight is a cast of a frozen low-precision graph input (one whose example
    needed no gradient at the conversion) rewritten as a ``frozen_product`` of the input itself; counted
    in ``module``'s ``FUSIONS``."""
    graph = module.graph
    rewritten = 0
    for cast in [node for node in graph.nodes if upcasts_input(node)]:
        source, dtype = args_of(cast)
        if INPUT_REQUIRES_GRAD.get(source, None) is not False:
            continue
        for reader in list(cast.users):
            arguments = _product_arguments(reader, cast, dtype)
            if arguments is None:
                continue
            with graph.inserting_before(reader):
                replacement = graph.call_function(frozen_product, (arguments[0], source, *arguments[1:]))
            replacement.meta = dict(reader.meta)
            reader.replace_all_uses_with(replacement)
            graph.erase_node(reader)
            rewritten += 1
        if not cast.users:
            graph.erase_node(cast)
    if rewritten:
        FUSIONS.setdefault(module, Counter())["frozen product upcast twice"] += rewritten


PRODUCTS: dict[Callable[..., Any], str] = {
    torch.matmul: "matmul",
    **dict.fromkeys(LINEARS, "linear"),
    gemm: "gemm",
    gemm_without_c: "gemm",
}


def _product_arguments(reader: fx.Node, cast: fx.Node, dtype: torch.dtype) -> tuple | None:
    """``(x, bias, kind, transposed, alpha, beta)`` of a product ``reader`` whose weight (second operand,
    2-D, to ``dtype``) is ``cast`` and nothing else; None for any other reader."""
    kind = PRODUCTS.get(reader.target) if reader.op == "call_function" else None  # type: ignore[arg-type]
    args, kwargs = args_of(reader), dict(kwargs_of(reader))
    if kind is None or len(args) < 2 or args[1] is not cast or cast in args[2:] or cast in kwargs.values():
        return None
    x, weight = val(args[0]), val(cast)
    if x is None or weight is None or weight.dim() != 2 or x.dim() < 2 or x.dtype != dtype:
        return None
    if kind == "matmul":
        return (args[0], None, kind, False, 1.0, 1.0) if len(args) == 2 and not kwargs else None
    if kind == "linear":
        bias = args[2] if len(args) > 2 else kwargs.pop("bias", None)
        return None if kwargs or len(args) > 3 else (args[0], bias, kind, True, 1.0, 1.0)
    bias = args[2] if len(args) > 2 else None
    if len(args) > 3 or kwargs.pop("trans_a", False) or x.dim() != 2:
        return None
    alpha, beta, transposed = kwargs.pop("alpha", 1.0), kwargs.pop("beta", 1.0), kwargs.pop("trans_b", False)
    return None if kwargs else (args[0], bias, kind, bool(transposed), float(alpha), float(beta))
