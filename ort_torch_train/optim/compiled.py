"""The AdamW and SGD updates as traceable torch code: run by torch.compile on their own, or inside a
compiled train step (``training/compiled_step.py``).

The per-step scalars are computed outside as ORT computes them (float32) and enter the kernel as one
small tensor, so their changing values never trigger a recompilation; only the mode and whether
weight decay applies are compiled in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

_COMPILED: dict[Callable, Callable] = {}


@dataclass(frozen=True)
class FusedUpdate:
    """An in-place update for a compiled train step: ``kernel(params, grads, *states, scalars, *constants)``.

    ``clip_max_norm`` clips the gradients first (ORT's InplaceClipGradNorm) when set.
    """

    kernel: Callable[..., None]
    constants: tuple
    clip_max_norm: float | None = None


def _compiled(function: Callable) -> Callable:
    if function not in _COMPILED:
        _COMPILED[function] = torch.compile(function, fullgraph=True, dynamic=False)
    return _COMPILED[function]


def adamw_scalars(
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction1: float,
    bias_correction2: float,
    corrected_lr: float,
    device: torch.device,
) -> Tensor:
    """The float32 scalars ``adamw_update`` reads, as one tensor on ``device`` (each value rounded once)."""
    values = adamw_scalar_values(
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        bias_correction1=bias_correction1,
        bias_correction2=bias_correction2,
        corrected_lr=corrected_lr,
    )
    return torch.from_numpy(np.array(values, dtype=np.float32)).to(device, non_blocking=True)


def adamw_scalar_values(
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction1: float,
    bias_correction2: float,
    corrected_lr: float,
) -> list[float]:
    """The values of ``adamw_scalars`` in its order, as Python floats (to be stored as float32)."""
    return [
        lr,
        beta1,
        1.0 - beta1,
        beta2,
        1.0 - beta2,
        eps,
        bias_correction1,
        bias_correction2,
        corrected_lr,
        weight_decay,
        lr * weight_decay,
    ]


def sgd_scalars(*, lr: float, device: torch.device) -> Tensor:
    """The float32 scalar ``sgd_update`` reads (``-lr``) as a tensor on ``device``."""
    return torch.from_numpy(np.array(-lr, dtype=np.float32)).to(device, non_blocking=True)


def compiled_adamw(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    adam_mode: int,
    bias_correction1: float,
    bias_correction2: float,
    corrected_lr: float,
) -> None:
    """ORT's AdamW update (the "single" math) run by a torch.compile'd kernel."""
    scalars = adamw_scalars(
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        bias_correction1=bias_correction1,
        bias_correction2=bias_correction2,
        corrected_lr=corrected_lr,
        device=params[0].device,
    )
    _compiled(adamw_update)(params, grads, exp_avgs, exp_avg_sqs, scalars, adam_mode, weight_decay != 0.0)


def compiled_sgd(params: list[Tensor], grads: list[Tensor], negative_lr: float) -> None:
    """``w += (-lr) * g`` run by a torch.compile'd kernel."""
    scalar = torch.tensor(negative_lr, dtype=torch.float32).to(params[0].device, non_blocking=True)
    _compiled(sgd_update)(params, grads, scalar)


def adamw_update(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    scalars: Tensor,
    adam_mode: int,
    decays: bool,
) -> None:
    """ORT's AdamW in its float32 op order, reading the step's values from ``adamw_scalars``."""
    lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, bc1, bc2, corrected_lr, wd, decay_after = scalars.unbind()
    for w, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        if adam_mode == 0 and decays:
            w.sub_(w * lr * wd)
        m.mul_(beta1).add_(g * one_minus_beta1)
        v.mul_(beta2).add_(g * one_minus_beta2 * g)
        if adam_mode == 0:
            w.sub_(m * lr / (((v / bc2).sqrt() + eps) * bc1))
        else:
            w.sub_(m * corrected_lr / (v.sqrt() + eps))
            if decays:
                w.sub_(w * decay_after)


def sgd_update(params: list[Tensor], grads: list[Tensor], negative_lr: Tensor) -> None:
    """``w += (-lr) * g``, the product rounded first as in ORT."""
    for w, g in zip(params, grads):
        w.add_(g * negative_lr)
