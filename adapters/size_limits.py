"""Refusing outputs no machine could hold: an Expand, Tile, ConstantOfShape or Range whose output would
need more bytes than this host's memory raises ``GraphSizeError`` at once, naming the op and the size,
instead of allocating until the process dies or reducing a broadcast view for hours."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from functools import cache

import torch

from ort_torch_train.errors import GraphSizeError

from .common import compiling_ahead


@cache
def host_memory_bytes() -> int:
    """This host's physical memory in bytes: no tensor larger can be materialised here or on its devices."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_output_size(op: str, shape: Sequence[int], dtype: torch.dtype) -> None:
    """Raise ``GraphSizeError`` when a ``dtype`` tensor of ``shape`` would not fit in this host's memory
    (not while a step is traced, ``compiling_ahead``: sizes may be symbolic, their values unknown until the step
    runs, and reading one as a number would fix its axis to the traced size)."""
    if compiling_ahead():
        return
    elements = math.prod(max(int(size), 0) for size in shape)
    needed = elements * dtype.itemsize
    if needed > host_memory_bytes():
        raise GraphSizeError(
            f"{op}: an output of shape {tuple(int(size) for size in shape)} ({elements} elements, {needed} bytes) "
            f"is larger than this machine's memory ({host_memory_bytes()} bytes)"
        )
