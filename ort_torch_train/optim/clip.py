"""ORT's ``com.microsoft.InplaceClipGradNorm`` on a list of gradients.

Reference: onnxruntime ``orttraining/training_ops/cpu/optimizer/clip_grad_norm/clip_grad_norm.cc``
(1.19.2), in float32:
    total_norm  = sqrt(sum over tensors of sum(g*g))
    coefficient = min(max_norm / (total_norm + 1e-6), 1)
    g *= coefficient                    (always applied; a no-op when coefficient is 1)
Only the summation order of the norm differs from ORT (float rounding).
"""

from __future__ import annotations

import torch
from torch import Tensor

CLIP_EPSILON = 1e-6


@torch.no_grad()
def clip_grad_norm_(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale ``grads`` in place so that their global L2 norm is at most ``max_norm``; return the norm.

    All grads must be on one device. The work stays on that device (no host synchronisation).
    """
    if len(grads) == 0:
        raise ValueError("clip_grad_norm_: grads must be a non-empty list of tensors; got an empty list")
    total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coefficient = torch.full_like(total_norm, max_norm).div_(total_norm + CLIP_EPSILON).clamp_(max=1.0)
    torch._foreach_mul_(grads, coefficient)
    return total_norm
