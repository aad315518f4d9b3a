"""Tensors to and from little-endian bytes, the layout of both checkpoint formats."""

from __future__ import annotations

import sys

import torch


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """The little-endian bytes of a tensor's elements, in row-major order (copied to the host)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    if sys.byteorder == "big" and tensor.dtype.itemsize > 1:
        flat = flat.reshape(-1, tensor.dtype.itemsize).flip(1).reshape(-1)
    return flat.numpy().tobytes()


def tensor_from_bytes(data: bytes | bytearray | memoryview, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A new CPU tensor owning a copy of little-endian data (unaligned input is fine).

    The caller has checked that len(data) == prod(shape) * dtype.itemsize. Bool bytes other than
    0 and 1 read as True.
    """
    if len(data) == 0:
        return torch.empty(shape, dtype=dtype)
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if sys.byteorder == "big" and dtype.itemsize > 1:
        tensor = tensor.reshape(-1, dtype.itemsize).flip(1).reshape(-1).clone()
    if dtype is torch.bool:
        return (tensor != 0).reshape(shape)
    return tensor.view(dtype).reshape(shape)
