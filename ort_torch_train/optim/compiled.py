"""The AdamW and SGD updates through torch.compile: fused loops, one compilation for every step.

The per-step scalars are computed outside as ORT computes them (float32) and enter the compiled
function as one small tensor, so their changing values never trigger a recompilation; only the
mode and whether weight decay applies are compiled in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ort_torch_train.optim.float32 import to_float32

_COMPILED: dict[Callable, Callable] = {}


def _compiled(function: Callable) -> Callable:
    if function not in _COMPILED:
        _COMPILED[function] = torch.compile(function, fullgraph=True, dynamic=False)
    return _COMPILED[function]


def compiled_adamw(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], *,
                   lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, adam_mode: int,
                   bias_correction1: float, bias_correction2: float, corrected_lr: float) -> None:
    """ORT's AdamW update (the "single" math) run by a torch.compile'd kernel."""
    values = [lr, beta1, to_float32(1.0 - beta1), beta2, to_float32(1.0 - beta2), eps, bias_correction1,
              bias_correction2, corrected_lr, weight_decay, to_float32(lr * weight_decay)]
    scalars = torch.tensor(values, dtype=torch.float32).to(params[0].device, non_blocking=True)
    _compiled(_adamw_update)(params, grads, exp_avgs, exp_avg_sqs, scalars, adam_mode, weight_decay != 0.0)


def compiled_sgd(params: list[Tensor], grads: list[Tensor], negative_lr: float) -> None:
    """``w += (-lr) * g`` run by a torch.compile'd kernel."""
    scalar = torch.tensor(negative_lr, dtype=torch.float32).to(params[0].device, non_blocking=True)
    _compiled(_sgd_update)(params, grads, scalar)


def _adamw_update(params, grads, exp_avgs, exp_avg_sqs, scalars: Tensor, adam_mode: int, decays: bool) -> None:
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


def _sgd_update(params, grads, negative_lr: Tensor) -> None:
    for w, g in zip(params, grads):
        w.add_(g * negative_lr)
