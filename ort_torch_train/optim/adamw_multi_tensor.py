"""AdamW's multi-tensor implementations (``adamw``'s "foreach" and "fused"): ORT's AdamWOptimizer over
whole tensor lists at once.

"foreach" runs torch's foreach kernels in ORT's float32 op order; "fused" maps ORT's update onto
``torch._fused_adamw_`` (torch's AdamW, ORT's mode 0, with per-step scalars for mode 1) and differs
from ORT's op order by float rounding only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ort_torch_train.optim.scratch import scaled_copy

if TYPE_CHECKING:
    from ort_torch_train.optim.adamw import AdamWHyperparameters, AdamWStepScalars

_FUSED_DEVICE_TYPES = ("cpu", "cuda")
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LARGEST_EXACT_FLOAT32_STEP = 2**24  # the fused kernel reads the step from a float32 tensor


def multi_tensor_adamw(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    s: AdamWStepScalars[float],
    adam_mode: int,
    decays: bool,
    *,
    scratch: tuple[list[Tensor], ...] | None,
) -> None:
    """``single_tensor_adamw``'s ops with torch's foreach kernels, on float scalars."""
    work, update = scratch if scratch is not None else (None, None)
    if adam_mode == 0 and decays:
        decay = scaled_copy(params, s.lr, work)
        torch._foreach_mul_(decay, s.weight_decay)
        torch._foreach_sub_(params, decay)
    torch._foreach_mul_(exp_avgs, s.beta1)
    torch._foreach_add_(exp_avgs, scaled_copy(grads, s.one_minus_beta1, work))
    squared = scaled_copy(grads, s.one_minus_beta2, work)
    torch._foreach_mul_(squared, grads)
    torch._foreach_mul_(exp_avg_sqs, s.beta2)
    torch._foreach_add_(exp_avg_sqs, squared)
    denom = scaled_copy(exp_avg_sqs, 1.0, work)
    if adam_mode == 0:
        torch._foreach_div_(denom, s.bias_correction2)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, s.eps)
        torch._foreach_mul_(denom, s.bias_correction1)
        step_update = scaled_copy(exp_avgs, s.lr, update)
    else:
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, s.eps)
        step_update = scaled_copy(exp_avgs, s.corrected_lr, update)
    torch._foreach_div_(step_update, denom)
    torch._foreach_sub_(params, step_update)
    if adam_mode == 1 and decays:
        torch._foreach_sub_(params, scaled_copy(params, s.decay_after, work))


def fused_adamw(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    hyperparameters: AdamWHyperparameters,
    step: int,
    step_tensor: Tensor | None,
) -> bool:
    """Run ``torch._fused_adamw_``; return False (nothing done) when the step's scalars do not fit it.

    torch's kernel is mode 0. Mode 1 is mode 0 with per-step scalars (bc1, bc2 as torch computes them):
    eps' = eps/sqrt(bc2) moves eps out of the bias correction, lr' = lr*(1 - lr*wd)*k and
    wd' = lr*wd/lr' turn the decay-before into ORT's decay-after, giving
    (1 - lr*wd) * (w - lr*sqrt(bc2)/bc1 * m/(sqrt(v) + eps)); k = bc1/sqrt(bc2) without bias
    correction (cancelling torch's), else 1.
    """
    if step > _LARGEST_EXACT_FLOAT32_STEP:
        return False
    h = hyperparameters
    lr, weight_decay, eps = h.lr, h.weight_decay, h.eps
    if h.adam_mode == 1:
        sqrt_bias_correction2 = math.sqrt(1.0 - h.beta2**step)
        undo_correction = 1.0 if h.correct_bias else (1.0 - h.beta1**step) / sqrt_bias_correction2
        decay = lr * weight_decay
        fused_lr = lr * (1.0 - decay) * undo_correction
        if fused_lr == 0.0 or not math.isfinite(fused_lr):
            return False
        lr, weight_decay, eps = fused_lr, decay / fused_lr, eps / sqrt_bias_correction2
    if step_tensor is None:
        step_tensor = torch.full((), float(step), dtype=torch.float32, device=params[0].device)
    else:
        step_tensor.fill_(float(step))
    torch._fused_adamw_(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        [step_tensor] * len(params),
        lr=lr,
        beta1=h.beta1,
        beta2=h.beta2,
        weight_decay=weight_decay,
        eps=eps,
        amsgrad=False,
        maximize=False,
    )
    return True


def fused_kernel_accepts(*tensor_lists: list[Tensor]) -> bool:
    """Whether ``torch._fused_adamw_`` runs these tensor lists: all on one cpu or cuda device, of one float dtype."""
    first = tensor_lists[0][0]
    if first.device.type not in _FUSED_DEVICE_TYPES or first.dtype not in _FUSED_DTYPES:
        return False
    return all(t.device == first.device and t.dtype == first.dtype for ts in tensor_lists for t in ts)
