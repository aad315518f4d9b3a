"""The fused update's per-step scalars on the host: one float32 buffer rewritten in place at every step."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


class HostScalars:
    """A CPU float32 tensor of ``count`` values (0-d for ``shape=()``), made once and rewritten by ``write``.

    A compiled step on CPU reads it before it returns, so the next step may overwrite it: no tensor is
    made per step, and the step's graph sees the same shape, dtype and device at every call.
    """

    __slots__ = ("_array", "_bytes", "_format", "tensor")

    def __init__(self, shape: tuple[int, ...]) -> None:
        self._array = np.zeros(shape, np.float32)
        self._bytes = self._array.reshape(-1).data.cast("B")
        self._format = struct.Struct(f"{self._array.size}f")  # each value rounded to float32 as it is packed
        self.tensor = torch.from_numpy(self._array)

    def write(self, values: float | Sequence[float]) -> Tensor:
        """The tensor, holding ``values`` (one float for a 0-d buffer) rounded to float32."""
        if isinstance(values, float):
            values = (values,)
        try:
            self._format.pack_into(self._bytes, 0, *values)
        except OverflowError:  # finite beyond float32's range: numpy's cast gives the infinity ORT's does
            self._array.reshape(-1)[:] = np.asarray(values, np.float64)
        return self.tensor
