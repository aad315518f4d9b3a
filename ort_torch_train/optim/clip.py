"""ORT's ``com.microsoft.InplaceClipGradNorm`` on a list of gradients.

Reference: onnxruntime ``orttraining/training_ops/cpu/optimizer/clip_grad_norm/clip_grad_norm.cc``
(1.19.2), in float32:
    total_norm  = sqrt(sum over tensors of sum(g*g))
    coefficient = min(max_norm / (total_norm + 1e-6), 1)
    g *= coefficient                    (always applied; a no-op when coefficient is 1)
Only the summation order of the norm differs from ORT (float rounding). With ``group`` each rank
holds a slice of the gradients (sharded optimizer state): the squared norms are summed across ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

CLIP_EPSILON = 1e-6


@torch.no_grad()
def clip_grad_norm_(
    grads: list[Tensor], max_norm: float, group: Any = None, whole: Sequence[bool] | None = None
) -> Tensor:
    """Scale ``grads`` in place so that their global L2 norm is at most ``max_norm``; return the norm.

    All grads must be on one device. The work stays on that device (no host synchronisation).
    ``group``: a process group whose ranks each hold a disjoint slice of the gradients; the norm is
    then that of all ranks' slices together (one all-reduce); ``whole``: per gradient, whether every rank
    of ``group`` holds it whole instead (counted once).
    """
    if len(grads) == 0:
        raise ValueError("clip_grad_norm_: grads must be a non-empty list of tensors; got an empty list")
    total_norm = global_norm(grads, group, whole)
    scale_to_norm(grads, total_norm, max_norm)
    return total_norm


@torch.no_grad()
def scale_to_norm(grads: list[Tensor], total_norm: Tensor, max_norm: float) -> None:
    """Scale ``grads`` in place as ORT's clip does when their global norm is ``total_norm``."""
    coefficient = torch.full_like(total_norm, max_norm).div_(total_norm + CLIP_EPSILON).clamp_(max=1.0)
    torch._foreach_mul_(grads, coefficient)


def global_norm(grads: Sequence[Tensor], group: Any = None, whole: Sequence[bool] | None = None) -> Tensor:
    """The L2 norm of ``grads`` together; with ``group`` (see ``clip_grad_norm_``) of every rank's slices."""
    # one tensor (flat buffers): its norm directly (inductor's C++ wrapper crashes on a one-tensor _foreach_norm)
    norms = (
        torch.stack(torch._foreach_norm(list(grads)))
        if len(grads) > 1
        else torch.linalg.vector_norm(grads[0]).reshape(1)
    )
    if group is None:
        return torch.linalg.vector_norm(norms)
    squared = norms.square()
    if whole is None:
        sliced = squared.sum()
        dist.all_reduce(sliced, op=dist.ReduceOp.SUM, group=group)
        return sliced.sqrt()
    held_whole = torch.tensor(list(whole), device=norms.device)
    sliced = squared[~held_whole].sum()
    dist.all_reduce(sliced, op=dist.ReduceOp.SUM, group=group)
    return (sliced + squared[held_whole].sum()).sqrt()
