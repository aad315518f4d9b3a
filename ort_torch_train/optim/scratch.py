"""Reusable buffers that let the foreach kernels run without allocating temporaries at each step.

Fresh CPU allocations of parameter-sized temporaries are page-faulted in at every step, which costs
more than the arithmetic; a scratch list made once and reused keeps each step to in-place passes.
"""

from __future__ import annotations

import torch
from torch import Tensor


def make_scratch(params: list[Tensor], lists: int) -> tuple[list[Tensor], ...]:
    """``lists`` lists of uninitialised buffers shaped like ``params``."""
    return tuple([torch.empty_like(p.detach()) for p in params] for _ in range(lists))


def scaled_copy(tensors: list[Tensor], factor: float, out: list[Tensor] | None) -> list[Tensor]:
    """``tensors * factor`` written into ``out``, or into new tensors when ``out`` is None."""
    if out is None:
        return list(torch._foreach_mul(tensors, factor))
    torch._foreach_copy_(out, tensors)
    if factor != 1.0:
        torch._foreach_mul_(out, factor)
    return out
