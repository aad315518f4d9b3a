"""com.microsoft MatMulNBits: ``A @ dequantize(B).T + bias`` over a block-quantised, bit-packed weight.

The packed weight stays packed: it is dequantised inside the forward and again inside the backward of
one autograd Function, so no float copy of it lives across a training step (QLoRA's memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .common import OperationConverterResult, attributes, result
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

SUPPORTED_BITS = (2, 4, 8)


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first ``count`` ``bits``-wide unsigned values along the last axis of ``packed`` (uint8, lowest
    bits first), as uint8."""
    if bits == 8:
        return packed[..., :count]
    per_byte = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    values = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)[..., :count]


def _values_into(buffer: torch.Tensor, scratch: torch.Tensor, packed: torch.Tensor, bits: int, count: int):
    """``unpack_bits(packed, bits, count)`` written into ``buffer`` (float, at least ``packed``'s leading
    shape by the last axis' value count): each of a byte's values shifted and masked into ``scratch``
    (uint8, at least ``packed``'s size), then into its strided place in ``buffer``; no new tensor."""
    per_byte = 8 // bits
    values = buffer.view(-1)[: packed.numel() * per_byte].view(*packed.shape, per_byte)
    if bits == 8:
        values[..., 0].copy_(packed)
    else:
        shifted = scratch.view(-1)[: packed.numel()].view(packed.shape)
        for position in range(per_byte):
            if position == 0:
                torch.bitwise_and(packed, (1 << bits) - 1, out=shifted)
            else:
                torch.bitwise_right_shift(packed, position * bits, out=shifted)
                if position < per_byte - 1:
                    shifted.bitwise_and_((1 << bits) - 1)
            values[..., position].copy_(shifted)
    return values.view(*packed.shape[:-1], -1)[..., :count]


def _float_values(packed: torch.Tensor, bits: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``unpack_bits(...)`` as ``dtype``, a fresh tensor."""
    per_byte = 1 if bits == 8 else 8 // bits
    buffer = torch.empty((*packed.shape[:-1], packed.shape[-1] * per_byte), dtype=dtype, device=packed.device)
    return _values_into(buffer, torch.empty_like(packed), packed, bits, count)


def _dequantize_into(
    values: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, bits: int, n: int, blocks: int
) -> torch.Tensor:
    """``(q - zero) * scale`` in place over the unpacked values ``(n, blocks, block_size)``."""
    if zero_points is None:
        values.sub_(float(1 << (bits - 1)))
    elif zero_points.dtype == torch.uint8:
        zero = unpack_bits(zero_points.reshape(n, -1), bits, blocks).to(scales.dtype)
        values.sub_(zero.reshape(n, blocks, 1))
    else:  # float zero points (the scales' type): (q - zp) * scale, as ORT's float-zero-point path
        values.sub_(zero_points.reshape(n, blocks, 1).to(scales.dtype))
    return values.mul_(scales.reshape(n, blocks, 1))


def dequantize_nbits(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    *,
    bits: int,
    block_size: int,
    k: int,
    n: int,
) -> torch.Tensor:
    """The ``(N, K)`` float weight of MatMulNBits' packed ``B`` ``(N, blocks, blob)``, in the scales' dtype."""
    blocks = (k + block_size - 1) // block_size
    values = _float_values(packed.reshape(n, blocks, -1), bits, block_size, scales.dtype)  # a fresh tensor
    return _dequantize_into(values, scales, zero_points, bits, n, blocks).reshape(n, blocks * block_size)[:, :k]


CHUNK_ELEMENTS = 1 << 23  # float weight elements dequantised at a time: 32 MiB in float32


def _row_chunks(packed: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, spec: dict):
    """``(start, stop, float rows of W)`` for successive row ranges of the ``(N, K)`` weight, each
    dequantised only when reached into one buffer of at most ``CHUNK_ELEMENTS`` float values that every
    range reuses: a consumer is done with a range before asking for the next."""
    n, k, bits, block_size = spec["n"], spec["k"], spec["bits"], spec["block_size"]
    blocks = (k + block_size - 1) // block_size
    rows = max(1, min(n, CHUNK_ELEMENTS // max(1, blocks * block_size)))
    packed, scales = packed.reshape(n, blocks, -1), scales.reshape(n, -1)
    zero = None if zero_points is None else zero_points.reshape(n, -1)
    buffer = torch.empty((rows, blocks * block_size), dtype=scales.dtype, device=packed.device)
    scratch = torch.empty((rows, *packed.shape[1:]), dtype=torch.uint8, device=packed.device)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        values = _values_into(buffer, scratch, packed[start:stop], bits, block_size)
        part = None if zero is None else zero[start:stop]
        weight = _dequantize_into(values, scales[start:stop], part, bits, stop - start, blocks)
        yield start, stop, weight.view(stop - start, blocks * block_size)[:, :k]


class _NBitsProduct(torch.autograd.Function):
    """``a @ W.T`` with ``W`` dequantised from its packed form, a block of rows at a time, in forward and
    again in backward: autograd keeps only the packed weight."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zero_points: Any, spec: Any):
        ctx.save_for_backward(packed, scales, *(() if zero_points is None else (zero_points,)))
        ctx.spec, ctx.has_zero = spec, zero_points is not None
        out = None
        for start, stop, weight in _row_chunks(packed, scales, zero_points, spec):
            part = a @ weight.to(a.dtype).t()  # functional: autocast decides its dtype as for any product
            if start == 0 and stop == spec["n"]:
                return part
            if out is None:  # the columns of each chunk written in place: no list of parts and their concatenation
                out = part.new_empty((*part.shape[:-1], spec["n"]))
            out[..., start:stop] = part
            del part  # before the next chunk is dequantised
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        packed, scales, *rest = ctx.saved_tensors
        grad_a = None
        if ctx.needs_input_grad[0]:
            for start, stop, weight in _row_chunks(packed, scales, rest[0] if ctx.has_zero else None, ctx.spec):
                part = grad[..., start:stop] @ weight.to(grad.dtype)
                grad_a = part if grad_a is None else grad_a.add_(part)
                del part  # before the next chunk is dequantised
        return grad_a, None, None, None, None


class MatMulNBits(nn.Module):
    """``A @ dequantize(B).T (+ bias)``; ``B`` and the quantisation parameters are never trained."""

    def __init__(self, k: int, n: int, bits: int, block_size: int) -> None:
        super().__init__()
        self.spec = dict(bits=bits, block_size=block_size, k=k, n=n)

    def forward(
        self,
        a: torch.Tensor,
        packed: torch.Tensor,
        scales: torch.Tensor,
        zero_points: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if g_idx is not None:
            raise NotImplementedError("MatMulNBits: the g_idx input (act-order) is not supported")
        if a.shape[-1] != self.spec["k"]:
            raise ValueError(f"MatMulNBits: input A's last dimension is {a.shape[-1]}, expected K={self.spec['k']}")
        out = _NBitsProduct.apply(a, packed, scales, zero_points, self.spec)
        return out if bias is None else out + bias.to(out.dtype)


@register("MatMulNBits", domain=MICROSOFT, quantized_inputs=(1, 3))
def matmul_nbits(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    bits = int(attrs.get("bits", 4))
    if bits not in SUPPORTED_BITS:
        raise NotImplementedError(f"MatMulNBits: bits={bits} is not supported (expected one of {SUPPORTED_BITS})")
    for name in ("K", "N", "block_size"):
        if name not in attrs:
            raise ValueError(f"MatMulNBits: the required attribute {name} is missing")
    block_size = int(attrs["block_size"])
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"MatMulNBits: block_size must be a power of 2 and >= 16, got {block_size}")
    return result(MatMulNBits(int(attrs["K"]), int(attrs["N"]), bits, block_size), node)
