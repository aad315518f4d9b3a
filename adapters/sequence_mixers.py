"""Recurrent sequence mixers of opset 27: LinearAttention (linear, gated, delta, gated-delta rules) and
CausalConvWithState (depthwise causal conv1d carrying its last k-1 inputs)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import OperationConverterResult, attributes, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(batch, time, heads * size)`` -> ``(batch, heads, time, size)``, at least float32."""
    batch, time, hidden = x.shape
    return _wide(x.reshape(batch, time, heads, hidden // heads).transpose(1, 2))


def _wide(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 as float32 (ONNX accumulates in float32); wider dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class LinearAttention(nn.Module):
    """ONNX LinearAttention: the state ``S (d_k x d_v)`` per KV head is decayed, delta-corrected, written
    with ``k v^T`` and read with ``q`` at each step (float32 accumulation; query heads share KV heads)."""

    def __init__(self, q_heads: int, kv_heads: int, scale: float, rule: str) -> None:
        super().__init__()
        self.q_heads, self.kv_heads, self.scale = q_heads, kv_heads, scale
        self.gating, self.delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        past_state: torch.Tensor | None = None,
        decay: torch.Tensor | None = None,
        beta: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, time, _ = query.shape
        q, k, v = _heads(query, self.q_heads), _heads(key, self.kv_heads), _heads(value, self.kv_heads)
        d_k, d_v = k.shape[-1], v.shape[-1]
        if decay is not None:  # per head (B, T, H) or per key dim (B, T, H * d_k) -> (B, H, T, 1 or d_k)
            per_head = decay.shape[-1] == self.kv_heads
            decay = _wide(
                decay.reshape(batch, time, self.kv_heads, 1).transpose(1, 2)
                if per_head
                else _heads(decay, self.kv_heads)
            )
        if beta is not None:
            beta = _wide(beta.reshape(batch, time, beta.shape[-1], 1).transpose(1, 2))
        state = _wide(past_state) if past_state is not None else q.new_zeros(batch, self.kv_heads, d_k, d_v)
        scale = self.scale or 1.0 / math.sqrt(d_k)
        group = self.q_heads // self.kv_heads
        if (self.gating and decay is None) or (self.delta and beta is None):
            raise ValueError("LinearAttention: the gated rules need a decay input, the delta rules a beta input")
        outputs = []
        for step in range(time):
            k_t, v_t = k[:, :, step], v[:, :, step]
            if self.gating and decay is not None:
                state = state * torch.exp(decay[:, :, step]).unsqueeze(-1)
            if self.delta and beta is not None:
                v_t = beta[:, :, step] * (v_t - torch.einsum("bhdm,bhd->bhm", state, k_t))
            state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
            read = state.repeat_interleave(group, dim=1) if group > 1 else state
            outputs.append(scale * torch.einsum("bhd,bhdm->bhm", q[:, :, step], read))
        output = torch.stack(outputs, dim=2).transpose(1, 2).reshape(batch, time, self.q_heads * d_v)
        present = state.to(past_state.dtype if past_state is not None else query.dtype)
        return output.to(query.dtype), present


@register("LinearAttention", since=27)
def linear_attention(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    module = LinearAttention(
        attrs["q_num_heads"],
        attrs["kv_num_heads"],
        float(attrs.get("scale", 0.0)),
        attrs.get("update_rule", "gated_delta"),
    )
    return result(module, node)


class CausalConvWithState(nn.Module):
    """Depthwise conv1d over ``[past_state (or zeros), input]``; also returns the last ``k - 1`` positions."""

    def __init__(self, silu: bool) -> None:
        super().__init__()
        self.silu = silu

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        past_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        width = weight.shape[2] - 1
        past = x.new_zeros(x.shape[0], x.shape[1], width) if past_state is None else past_state
        padded = torch.cat((past, x), dim=2)
        out = F.conv1d(padded, weight, bias, groups=x.shape[1])
        if self.silu:
            out = F.silu(_wide(out)).to(x.dtype)
        return out, padded[:, :, padded.shape[2] - width :]


@register("CausalConvWithState", since=27)
def causal_conv_with_state(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(CausalConvWithState(attributes(node).get("activation", "none") in ("silu", "swish")), node)
