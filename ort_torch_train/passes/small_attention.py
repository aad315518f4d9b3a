"""Small attention in compiled CPU graphs as products and sums, which inductor fuses into its loops.

At a tiny transformer's sizes (a few positions, heads of 16 values) the CPU flash-attention kernels
cost more per call than the work, most of it in the backward kernel. ``small_attention_products`` rewrites the graph's
``F.scaled_dot_product_attention`` calls (the attention fusion's output) whose heads are small into
``attention_products``: scores and output as broadcast products summed over one axis, no GEMM, so that
inductor generates the scores, the softmax and the weighted sum (and their backward) as a few C++
loops. Eager graphs keep the flash kernels, which beat these products when each op is dispatched alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx

from ort_torch_train.passes.match import args_of, val
from ort_torch_train.passes.meta_keys import FUSIONS

# the most query x key positions per head rewritten as products (chosen with bench/experiments/small_attention.py)
MAX_SCORES = 32 * 32
# head sizes: a multiple of the widest float32 vector (AVX-512's lanes); other heads run slower as products
HEAD_MULTIPLE = 16


def attention_products(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention`` without dropout, written as products summed over one axis
    (under autocast, the SDPA call itself: its output dtype follows autocast's rules)."""
    if torch.is_autocast_enabled(query.device.type):
        return F.scaled_dot_product_attention(query, key, value, attn_mask, scale=scale, is_causal=is_causal)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = (query.unsqueeze(-2) * key.unsqueeze(-3)).sum(-1) * scale
    if is_causal:
        positions = scores.shape[-2:]
        allowed = torch.ones(positions, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return _RowMajorGradient.apply((torch.softmax(scores, -1).unsqueeze(-1) * value.unsqueeze(-3)).sum(-2))


class _RowMajorGradient(torch.autograd.Function):
    """The identity, whose backward hands on a row-major copy of the incoming gradient.

    The gradient of attention's output arrives with the heads' permutation of a stored product's
    output; the weighted sum's backward unsqueezes it, and inductor lowers the unsqueeze of a stored
    strided tensor as a view whose strides it computes with a guard that the batch is not 1
    (``View.create``), so that batch 1 would compile a graph of its own. A row-major copy is a view
    without that guard."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(context: Any, inputs: tuple[Tensor], output: Tensor) -> None:
        pass

    @staticmethod
    def backward(context: Any, grad: Tensor) -> Tensor:
        return grad.clone(memory_format=torch.contiguous_format)


def small_attention_products(module: fx.GraphModule, device: torch.device) -> None:
    """On CPU, ``module``'s small float32 attention calls rewritten to ``attention_products`` (in place,
    for torch.compile); the count is added to ``module``'s ``FUSIONS``."""
    if device.type != "cpu":
        return
    rewritten = 0
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is F.scaled_dot_product_attention and _small(node):
            node.target = attention_products
            rewritten += 1
    if rewritten:
        FUSIONS.setdefault(module, Counter())["small_attention"] += rewritten


def _small(node: fx.Node) -> bool:
    query, key = val(args_of(node)[0]), val(args_of(node)[1])
    if query is None or key is None or query.dtype != torch.float32:
        return False
    if len(args_of(node)) > 4 or not set(node.kwargs) <= {"attn_mask", "scale", "is_causal"}:
        return False  # dropout, grouped-query heads: SDPA's
    head = query.shape[-1]
    return head % HEAD_MULTIPLE == 0 and query.shape[-2] * key.shape[-2] <= MAX_SCORES
