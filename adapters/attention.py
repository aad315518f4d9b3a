"""Attention (opset 23+: masks, KV cache, GQA, softcap), FlexAttention (preview), RotaryEmbedding, TensorScatter."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ort_torch_train.dtypes import torch_dtype

from .common import (
    Inline,
    OnnxGraph,
    OnnxNode,
    OperationConverterResult,
    attributes,
    input_dtype,
    input_shape,
    result,
)
from .index_checks import checked_indices, index_source
from .registry import ConversionContext, register

_NEG_INF = float("-inf")


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(batch, seq, heads * size)`` -> ``(batch, heads, seq, size)``."""
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, heads, hidden // heads).transpose(1, 2)


def _frontier(q_len: int, kv_len: int, offset, device) -> torch.Tensor:
    """``(i + offset) - j`` for query ``i`` and key ``j``: ``(q, kv)``, or ``(batch, 1, q, kv)`` per batch."""
    rows = torch.arange(q_len, device=device).reshape(q_len, 1)
    columns = torch.arange(kv_len, device=device).reshape(1, kv_len)
    if isinstance(offset, torch.Tensor):
        return (rows + offset.reshape(-1, 1, 1, 1)) - columns
    return (rows + offset) - columns


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed``, ``-inf`` elsewhere, in ``dtype``."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, _NEG_INF)


class Attention(nn.Module):
    """ONNX Attention: bias from mask, causal frontier, sliding window and padding; then softmax(QK^T)V."""

    def __init__(self, attrs: dict, outputs: int) -> None:
        super().__init__()
        self.scale = attrs.get("scale")
        self.is_causal = bool(attrs.get("is_causal", 0))
        self.q_heads, self.kv_heads = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
        self.softcap = float(attrs.get("softcap", 0.0))
        precision = attrs.get("softmax_precision")
        self.softmax_dtype = torch_dtype(precision) if precision else None
        self.qk_mode = int(attrs.get("qk_matmul_output_mode", 0))
        self.left, self.right = int(attrs.get("left_window_size", -1)), int(attrs.get("right_window_size", -1))
        self.outputs = outputs

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
        nonpad_kv_seqlen: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor | None, ...]:
        three_d = q.dim() == 3
        if three_d:
            if self.q_heads is None or self.kv_heads is None:
                raise ValueError("Attention: 3-D inputs need the q_num_heads and kv_num_heads attributes")
            q, k, v = _split_heads(q, self.q_heads), _split_heads(k, self.kv_heads), _split_heads(v, self.kv_heads)
        if past_key is not None:
            if past_value is None:
                raise ValueError("Attention: past_key is given without past_value")
            k, v = torch.cat((past_key, k), dim=2), torch.cat((past_value, v), dim=2)
        present_key, present_value = k, v
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        if q.shape[1] != k.shape[1]:
            repeats = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        plain_causal = self.is_causal and attn_mask is None and past_key is None and nonpad_kv_seqlen is None
        if plain_causal and self.left < 0 and self.right < 0 and self._fused(q):  # top-left causal, as torch's
            y, qk = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale), None
        else:
            y, qk = self._attend(q, k, v, self._bias(q, k.shape[2], attn_mask, past_key, nonpad_kv_seqlen), scale)
        if three_d:
            y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
        return (y, present_key, present_value, qk)[: self.outputs] if self.outputs > 1 else y

    def _attend(self, q, k, v, bias, scale) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Y (and the qk output) under an additive ``bias``; rows no key may attend give zeros, as in ONNX,
        with no NaN in the gradients."""
        masked_rows = None
        if bias is not None:
            masked_rows = torch.isneginf(bias.amax(dim=-1, keepdim=True))
            bias = bias.masked_fill(masked_rows, 0.0)
        if self._fused(q):
            y, qk = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale), None
        else:
            y, qk = self._explicit(q, k, v, bias, masked_rows, scale)
        return (y if masked_rows is None else y.masked_fill(masked_rows, 0.0)), qk

    def _fused(self, q: torch.Tensor) -> bool:
        """Whether torch's fused kernel computes it (float16 on CPU: step by step, rounding as ONNX does)."""
        plain = self.outputs < 4 and self.softcap <= 0 and self.softmax_dtype in (None, q.dtype)
        return plain and not (q.dtype == torch.float16 and q.device.type == "cpu")

    def _bias(self, q, kv_len, attn_mask, past_key, nonpad_kv_seqlen):
        """The additive bias (``-inf`` where a key is not attended), or None when every key is."""
        q_len, dtype, device = q.shape[2], q.dtype, q.device
        bias = None
        if attn_mask is not None:
            pad = kv_len - attn_mask.shape[-1]
            if attn_mask.dtype == torch.bool:
                attn_mask = _additive(attn_mask, dtype)
            bias = F.pad(attn_mask, (0, pad), value=_NEG_INF) if pad > 0 else attn_mask
        if past_key is not None:
            offset = past_key.shape[2]
        elif nonpad_kv_seqlen is not None:
            offset = nonpad_kv_seqlen.to(torch.int64) - q_len
        else:
            offset = 0
        frontier = None
        if self.is_causal or self.left >= 0 or self.right >= 0:
            frontier = _frontier(q_len, kv_len, offset, device)
        terms = []
        if self.is_causal:
            terms.append(_additive(frontier >= 0, dtype))
        if self.left >= 0 or self.right >= 0:
            allowed = torch.ones_like(frontier, dtype=torch.bool)
            if self.left >= 0:
                allowed &= frontier <= self.left
            if self.right >= 0:
                allowed &= -frontier <= self.right
            terms.append(_additive(allowed, dtype))
        if nonpad_kv_seqlen is not None:
            valid = torch.arange(kv_len, device=device) < nonpad_kv_seqlen.reshape(-1, 1, 1, 1)
            terms.append(_additive(valid, dtype))
        for term in terms:
            bias = term if bias is None else bias + term
        return bias

    def _explicit(self, q, k, v, bias, masked_rows, scale):
        """Softcap, softmax precision and the ``qk_matmul_output`` output, step by step as ONNX defines them."""
        root = torch.tensor(math.sqrt(scale), dtype=q.dtype)
        scores = (q * root) @ (k * root).transpose(-1, -2)
        if self.softcap > 0:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        qk = scores
        if bias is not None:
            scores = scores + bias
        if self.qk_mode == 2:
            qk = scores.masked_fill(masked_rows, _NEG_INF) if masked_rows is not None else scores
        probabilities = torch.softmax(scores.to(self.softmax_dtype or q.dtype), dim=-1)
        if masked_rows is not None:
            probabilities = probabilities.masked_fill(masked_rows, 0.0)
        probabilities = probabilities.to(q.dtype)
        if self.qk_mode == 3:
            qk = probabilities
        return probabilities @ v, qk


@register("Attention", since=23)
def attention(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Attention(attributes(node), len(node.output_values)), node)


def rotary_embedding(
    x: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    interleaved: bool,
    rotary_dim: int,
    heads: int,
) -> torch.Tensor:
    """ONNX RotaryEmbedding on ``(batch, heads, seq, size)`` or ``(batch, seq, heads * size)`` input."""
    shape = x.shape
    x = x.transpose(1, 2) if x.dim() == 4 else x.reshape(shape[0], shape[1], heads, shape[2] // heads)
    rotary_dim = rotary_dim or x.shape[-1]
    rotated, kept = x[..., :rotary_dim], x[..., rotary_dim:]
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)
    if interleaved:
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    else:
        first, second = rotated.chunk(2, dim=-1)
    real, imaginary = cos * first - sin * second, sin * first + cos * second
    if interleaved:
        rotated = torch.stack((real, imaginary), dim=-1).reshape(rotated.shape)
    else:
        rotated = torch.cat((real, imaginary), dim=-1)
    out = torch.cat((rotated, kept), dim=-1)
    return out.reshape(shape) if len(shape) == 3 else out.transpose(1, 2)


@register("RotaryEmbedding", since=23)
def rotary_embedding_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    kwargs = dict(
        interleaved=bool(attrs.get("interleaved", 0)),
        rotary_dim=int(attrs.get("rotary_embedding_dim", 0)),
        heads=int(attrs.get("num_heads", 0)),
    )
    return result(Inline(rotary_embedding, **kwargs), node)


def tensor_scatter(
    cache: torch.Tensor,
    update: torch.Tensor,
    write_indices: torch.Tensor | None = None,
    *,
    axis: int,
    circular: bool,
    source: tuple[str, str],
) -> torch.Tensor:
    """ONNX TensorScatter: ``update`` written into ``cache`` along ``axis`` from each batch's write index."""
    axis %= cache.dim()
    batch, length = update.shape[0], update.shape[axis]
    if write_indices is None:
        start = torch.zeros(batch, dtype=torch.int64, device=cache.device)
    else:  # linear: the update must fit from its start; circular: the start must lie in the cache
        high = cache.shape[axis] if circular else cache.shape[axis] - length + 1
        start = checked_indices(write_indices, 0, high, *source)
    positions = start.to(torch.int64).reshape(batch, 1) + torch.arange(length, device=cache.device)
    if circular:
        positions = positions % cache.shape[axis]
    shape = [batch] + [1] * (update.dim() - 1)
    shape[axis] = length
    return cache.scatter(axis, positions.reshape(shape).expand(update.shape), update)


@register("TensorScatter", since=24)
def tensor_scatter_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    circular = attrs.get("mode", "linear") == "circular"
    kwargs = dict(axis=attrs.get("axis", -2), circular=circular, source=index_source(node, 2))
    return result(Inline(tensor_scatter, **kwargs), node)


class FlexAttention(nn.Module):
    """ai.onnx.preview FlexAttention: softmax(score_mod(QK^T scaled)) -> prob_mod -> @V, the mods being
    converted subgraphs over the whole score tensor; softmax in float32 for narrower inputs."""

    def __init__(
        self,
        scale: float | None,
        softmax_dtype: torch.dtype | None,
        score_mod: nn.Module | None,
        prob_mod: nn.Module | None,
    ) -> None:
        super().__init__()
        self.scale, self.softmax_dtype = scale, softmax_dtype
        self.score_mod, self.prob_mod = score_mod, prob_mod

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[1] != k.shape[1]:
            repeats = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        root = torch.tensor(math.sqrt(scale), dtype=torch.float32).to(q.dtype)
        dtype = self.softmax_dtype or (torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype)
        scores = ((q * root) @ (k * root).transpose(-1, -2)).to(dtype)
        if self.score_mod is not None:
            scores = self.score_mod(scores)[0].to(dtype)
        probabilities = torch.softmax(scores, dim=-1)
        if self.prob_mod is not None:
            probabilities = self.prob_mod(probabilities)[0].to(dtype)
        return (probabilities @ v.to(dtype)).to(v.dtype)


@register("FlexAttention", domain="ai.onnx.preview", since=1)
def flex_attention(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    if context.convert_subgraph is None:
        raise NotImplementedError("FlexAttention: its score_mod and prob_mod need the graph's conversion")
    attrs = attributes(node)
    q_shape, k_shape = input_shape(node, graph, 0), input_shape(node, graph, 1)
    precision = attrs.get("softmax_precision")
    q_dtype = input_dtype(node, graph, 0)
    dtype = (
        torch_dtype(precision)
        if precision
        else (torch.float32 if q_dtype in (torch.float16, torch.bfloat16) else q_dtype)
    )
    scores = torch.zeros((q_shape[0], q_shape[1], q_shape[2], k_shape[2]), dtype=dtype)
    mods = [
        context.convert_subgraph(attrs[name].g, [scores]) if name in attrs else None
        for name in ("score_mod", "prob_mod")
    ]
    return result(FlexAttention(attrs.get("scale"), torch_dtype(precision) if precision else None, *mods), node)
