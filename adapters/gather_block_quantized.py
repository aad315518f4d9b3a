"""com.microsoft GatherBlockQuantized: rows of a block-quantised, bit-packed table, dequantised.

onnxruntime-genai's builder emits it for the embedding of a model whose embedding and LM head are tied
(its int4 default): the table is the LM head's packed MatMulNBits weight, reshaped. Only the gathered rows
are dequantised; the packed table stays packed and is never trained (its scales get a gradient where they
are trainable).

uint8 data, as onnxruntime's CPU kernel takes it: ``bits`` (2, 4, 8) values per byte along the last axis,
lowest bits first; ``gather_axis`` 0 and ``quantize_axis`` the last one; scales of the data's shape with
the last axis counted in blocks of ``block_size`` values; zero points packed as the data (default
``2 ** (bits - 1)``). An index outside ``[-rows, rows)`` raises (onnxruntime writes zeros).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx
import torch
import torch.nn.functional as F
from torch import nn

from .common import OperationConverterResult, attributes, input_shape, result
from .index_checks import index_source, wrapped_indices
from .matmul_nbits import unpack_bits
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

SUPPORTED_BITS = (2, 4, 8)


def dequantize_rows(
    packed: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, bits: int, block_size: int
) -> torch.Tensor:
    """The float values (the scales' dtype) of ``packed`` uint8 rows ``[..., bytes]``, blocks along the last axis."""
    count = packed.shape[-1] * (8 // bits)
    blocks = scales.shape[-1]
    values = unpack_bits(packed, bits, count).to(scales.dtype)
    values = F.pad(values, (0, blocks * block_size - count)).reshape(*values.shape[:-1], blocks, block_size)
    if zero_points is None:
        zero = torch.tensor(float(1 << (bits - 1)), dtype=scales.dtype, device=scales.device)
    else:
        zero = unpack_bits(zero_points, bits, blocks).to(scales.dtype).unsqueeze(-1)
    dequantized = (values - zero) * scales.unsqueeze(-1)
    return dequantized.reshape(*values.shape[:-2], blocks * block_size)[..., :count]


class GatherBlockQuantized(nn.Module):
    """``dequantize(data)[indices]`` along axis 0, dequantising only the gathered rows."""

    def __init__(self, bits: int, block_size: int, source: tuple[str, str]) -> None:
        super().__init__()
        self.bits, self.block_size, self.source = bits, block_size, source

    def forward(
        self,
        data: torch.Tensor,
        indices: torch.Tensor,
        scales: torch.Tensor,
        zero_points: torch.Tensor | None = None,
    ) -> torch.Tensor:
        count = data.shape[-1] * (8 // self.bits)
        blocks = (count + self.block_size - 1) // self.block_size
        if scales.shape[:-1] != data.shape[:-1] or scales.shape[-1] != blocks:
            raise ValueError(
                f"GatherBlockQuantized: scales have shape {list(scales.shape)}, expected {[*data.shape[:-1], blocks]} "
                f"for data {list(data.shape)} ({count} values per row, block_size {self.block_size})"
            )
        per_byte = 8 // self.bits
        if zero_points is not None and (
            zero_points.shape[:-1] != data.shape[:-1] or zero_points.shape[-1] != (blocks + per_byte - 1) // per_byte
        ):
            raise ValueError(
                f"GatherBlockQuantized: zero_points have shape {list(zero_points.shape)}, expected "
                f"{[*data.shape[:-1], (blocks + per_byte - 1) // per_byte]} (scales {list(scales.shape)}, packed)"
            )
        flat = wrapped_indices(indices, data.shape[0], *self.source).reshape(-1)
        zero = None if zero_points is None else zero_points.index_select(0, flat)
        values = dequantize_rows(
            data.index_select(0, flat), scales.index_select(0, flat), zero, self.bits, self.block_size
        )
        return values.reshape(*indices.shape, *values.shape[1:])


def normalized(axis: int, rank: int) -> int | None:
    """``axis`` counted from the front, or None outside ``[-rank, rank)``."""
    return axis + rank if -rank <= axis < 0 else axis if 0 <= axis < rank else None


@register("GatherBlockQuantized", domain=MICROSOFT, quantized_inputs=(0, 3))
def gather_block_quantized(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    bits, block_size = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    if bits not in SUPPORTED_BITS:
        raise NotImplementedError(
            f"GatherBlockQuantized: bits={bits} is not supported (expected one of {SUPPORTED_BITS})"
        )
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"GatherBlockQuantized: block_size must be a power of 2 and >= 16, got {block_size}")
    data_name = node.input_values[0]
    elem_type = (
        graph.initializers[data_name].proto.data_type
        if data_name in graph.initializers
        else graph.value_info[data_name].type.tensor_type.elem_type
    )
    if elem_type != onnx.TensorProto.UINT8:
        raise NotImplementedError(
            f"GatherBlockQuantized: data {data_name!r} of type {onnx.TensorProto.DataType.Name(elem_type)} is not "
            "supported (expected uint8, bit-packed as onnxruntime-genai's builder writes it)"
        )
    rank = len(input_shape(node, graph, 0))
    gather_axis, quantize_axis = int(attrs.get("gather_axis", 0)), int(attrs.get("quantize_axis", 1))
    if normalized(gather_axis, rank) != 0 or normalized(quantize_axis, rank) != rank - 1:
        raise NotImplementedError(
            f"GatherBlockQuantized: uint8 data needs gather_axis 0 and quantize_axis the last axis ({rank - 1}), "
            f"got gather_axis={gather_axis}, quantize_axis={quantize_axis}"
        )
    return result(GatherBlockQuantized(bits, block_size, index_source(node, 1)), node)
