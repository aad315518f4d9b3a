"""The fused update's per-step scalars on the host: one float32 buffer rewritten in place at every step."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from ort_torch_train.optim.algorithm import Hyperparameters


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


class RecomputedStepScalars:
    """``step_scalars`` (an ``OptimizerAlgorithm``'s) computed afresh at every step and written into one
    ``HostScalars`` buffer: the ``HostStepScalars`` of an algorithm without a writer of its own."""

    __slots__ = ("_host", "_step_scalars")

    def __init__(self, step_scalars: Callable[[Hyperparameters, int], float | Sequence[float]]) -> None:
        self._step_scalars = step_scalars
        self._host: HostScalars | None = None

    def write(self, hyperparameters: Hyperparameters, step: int) -> Tensor:
        """The buffer's tensor, holding the scalars of the 1-based ``step``."""
        scalars = self._step_scalars(hyperparameters, step)
        host = self._host
        if host is None:
            host = self._host = HostScalars(() if isinstance(scalars, float) else (len(scalars),))
        return host.write(scalars)
