"""com.microsoft GroupQueryAttention, as onnxruntime-genai's model builder emits it: packed or separate
Q/K/V, rotary embedding from cos/sin caches, a KV cache (empty in training), ``seqlens_k`` padding,
``scale``, ``softcap``, ``local_window_size`` and ``sliding_window_cache`` (with an empty cache); attention by torch SDPA (``enable_gqa``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .attention import rotary_embedding
from .common import OperationConverterResult, attributes, has_input, result
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

SUPPORTED_ATTRIBUTES = frozenset(
    {
        "num_heads",
        "kv_num_heads",
        "scale",
        "softcap",
        "local_window_size",
        "do_rotary",
        "rotary_interleaved",
        "sliding_window_cache",  # window-sized KV buffers: with the empty cache of training only
    }
)
ZERO_DEFAULT_ATTRIBUTES = ("smooth_softmax", "qk_output")  # accepted at their default 0 only
UNSUPPORTED_INPUTS = {11: "head_sink"}


class GroupQueryAttention(nn.Module):
    """GroupQueryAttention on ``(batch, seq, hidden)`` inputs; returns (output, present_key, present_value)."""

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        scale: float | None,
        softcap: float,
        window: int,
        rotary: bool,
        interleaved: bool,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.scale, self.softcap = heads, kv_heads, scale, softcap
        self.window, self.rotary, self.interleaved = window, rotary, interleaved
        self.outputs = 3
        self.window_cache = False  # sliding_window_cache=1: past/present buffers hold the last window only

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
        seqlens_k: torch.Tensor | None = None,
        total_sequence_length: torch.Tensor | None = None,
        cos_cache: torch.Tensor | None = None,
        sin_cache: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_bias: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        batch, seq, _ = query.shape
        if self.window_cache and past_key is not None and past_key.shape[2] > 0:
            raise NotImplementedError(
                f"GroupQueryAttention: sliding_window_cache=1 with a past key/value buffer of {past_key.shape[2]} "
                "rows is not supported (an empty cache, as in training, is: the present holds every position)"
            )
        if seqlens_k is None or total_sequence_length is None:
            raise ValueError("GroupQueryAttention: the seqlens_k and total_sequence_length inputs are required")
        if key is None or value is None:  # packed: (batch, seq, (heads + 2 * kv_heads) * head_size)
            size = query.shape[-1] // (self.heads + 2 * self.kv_heads)
            query, key, value = query.split([self.heads * size, self.kv_heads * size, self.kv_heads * size], dim=-1)
        size = query.shape[-1] // self.heads
        total = seqlens_k.to(torch.int64).reshape(batch, 1) + 1
        first_prompt = total_sequence_length.reshape(()).to(torch.int64) == seq
        past_lengths = torch.where(first_prompt, torch.zeros_like(total), (total - seq).clamp(min=0))  # (batch, 1)
        positions = past_lengths + torch.arange(seq, device=query.device)  # (batch, seq)
        if self.rotary:
            if cos_cache is None or sin_cache is None:
                raise ValueError("GroupQueryAttention: do_rotary=1 needs the cos_cache and sin_cache inputs")
            ids = positions if position_ids is None else position_ids.to(torch.int64)
            dim, interleaved = 2 * cos_cache.shape[-1], self.interleaved
            query = rotary_embedding(
                query, cos_cache, sin_cache, ids, interleaved=interleaved, rotary_dim=dim, heads=self.heads
            )
            key = rotary_embedding(
                key, cos_cache, sin_cache, ids, interleaved=interleaved, rotary_dim=dim, heads=self.kv_heads
            )
        q = query.reshape(batch, seq, self.heads, size).transpose(1, 2)
        k = key.reshape(batch, seq, self.kv_heads, size).transpose(1, 2)
        v = value.reshape(batch, seq, self.kv_heads, size).transpose(1, 2)
        present_key, present_value = (
            self._present(past_key, k, past_lengths),
            self._present(past_value, v, past_lengths),
        )
        allowed = self._allowed(positions, present_key.shape[2])
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))
        if attention_bias is not None:
            bias = bias + attention_bias.to(q.dtype)
        scale = self.scale if self.scale else 1.0 / math.sqrt(size)
        if self.softcap > 0:
            keys = present_key.repeat_interleave(self.heads // self.kv_heads, dim=1)
            values = present_value.repeat_interleave(self.heads // self.kv_heads, dim=1)
            scores = torch.tanh((q @ keys.transpose(-1, -2)) * (scale / self.softcap)) * self.softcap
            y = torch.softmax(scores + bias, dim=-1) @ values
        else:
            y = F.scaled_dot_product_attention(
                q, present_key, present_value, attn_mask=bias, scale=scale, enable_gqa=True
            )
        y = y.transpose(1, 2).reshape(batch, seq, self.heads * size)
        return (y, present_key, present_value)[: self.outputs] if self.outputs > 1 else y

    @staticmethod
    def _present(past: torch.Tensor | None, new: torch.Tensor, past_lengths: torch.Tensor) -> torch.Tensor:
        """The cache after this step: each batch's first ``past_length`` past rows, then the new rows."""
        if past is None or past.shape[2] == 0:
            return new
        length = past.shape[2] + new.shape[2]
        cache = F.pad(past, (0, 0, 0, new.shape[2]))
        rows = (past_lengths.reshape(-1, 1) + torch.arange(new.shape[2], device=new.device)).clamp(max=length - 1)
        index = rows.reshape(new.shape[0], 1, new.shape[2], 1).expand(new.shape)
        return cache.scatter(2, index, new)

    def _allowed(self, positions: torch.Tensor, keys: int) -> torch.Tensor:
        """``(batch, 1, seq, keys)``: key ``j`` is attended by the query at ``position`` when ``j <= position``
        and, with a local window, ``position - j < local_window_size``."""
        j = torch.arange(keys, device=positions.device)
        frontier = positions.unsqueeze(-1) - j  # (batch, seq, keys)
        allowed = frontier >= 0
        if self.window > 0:
            allowed &= frontier < self.window
        return allowed.unsqueeze(1)


@register("GroupQueryAttention", domain=MICROSOFT)
def group_query_attention(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    for name in ZERO_DEFAULT_ATTRIBUTES:
        if attrs.get(name, 0):
            raise NotImplementedError(f"GroupQueryAttention: attribute {name}={attrs[name]} is not supported")
    unknown = sorted(set(attrs) - SUPPORTED_ATTRIBUTES - set(ZERO_DEFAULT_ATTRIBUTES))
    if unknown:
        raise NotImplementedError(
            f"GroupQueryAttention: attributes {unknown} are not supported (supported: {sorted(SUPPORTED_ATTRIBUTES)})"
        )
    for position, name in UNSUPPORTED_INPUTS.items():
        if has_input(node, position):
            raise NotImplementedError(f"GroupQueryAttention: the {name} input is not supported")
    if len(node.output_values) > 3:
        raise NotImplementedError("GroupQueryAttention: the output_qk output is not supported")
    for name in ("num_heads", "kv_num_heads"):
        if name not in attrs:
            raise ValueError(f"GroupQueryAttention: the required attribute {name} is missing")
    module = GroupQueryAttention(
        int(attrs["num_heads"]),
        int(attrs["kv_num_heads"]),
        attrs.get("scale"),
        float(attrs.get("softcap", 0.0)),
        int(attrs.get("local_window_size", -1)),
        bool(attrs.get("do_rotary", 0)),
        bool(attrs.get("rotary_interleaved", 0)),
    )
    module.outputs = len(node.output_values)
    module.window_cache = bool(attrs.get("sliding_window_cache", 0))
    if module.window_cache and module.window <= 0:
        raise ValueError("GroupQueryAttention: sliding_window_cache=1 needs local_window_size > 0")
    inputs = list(node.input_values[:11])
    return result(module, node, inputs)
