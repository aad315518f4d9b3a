"""What the optimizer kernels need to run compiled: torch.compile'd kernels, their scalars as one
tensor, and the update a compiled train step (``training/compile/step.py``) runs in its own graph.

The per-step scalars are computed outside as ORT computes them (float32) and enter a kernel as one
small tensor, so their changing values never trigger a recompilation; only the constants (the mode,
whether weight decay applies) are compiled in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

_COMPILED: dict[Callable[..., None], Callable[..., None]] = {}


@dataclass(frozen=True)
class FusedUpdate:
    """An in-place update for a compiled train step: ``kernel(params, grads, *states, scalars, *constants)``.

    ``clip_max_norm`` clips the gradients first (ORT's InplaceClipGradNorm) when set.
    """

    kernel: Callable[..., None]
    constants: tuple[object, ...]
    clip_max_norm: float | None = None


def compiled(kernel: Callable[..., None]) -> Callable[..., None]:
    """``kernel`` through torch.compile (whole graph, static shapes), compiled once per kernel."""
    if kernel not in _COMPILED:
        _COMPILED[kernel] = torch.compile(kernel, fullgraph=True, dynamic=False)
    return _COMPILED[kernel]


def scalar_tensor(values: float | Sequence[float], device: torch.device) -> Tensor:
    """``values`` as a float32 tensor on ``device`` (a 0-d one for a single value), each rounded once."""
    return torch.from_numpy(np.array(values, dtype=np.float32)).to(device, non_blocking=True)
