"""ORT's ``com.microsoft.LambOptimizer`` as an in-place torch kernel.

Reference: onnxruntime ``orttraining/training_ops/cuda/optimizer/lamb_impl.cu`` and the CPU reference
``compute_lamb`` of its optimizer tests. Per tensor, in float32, with t = step:

    s = grad_scale                            (loss scale times the global-norm clip factor; 1 if None)
    g = g / s ;  m = alpha*m + (1-alpha)*g ;  v = beta*v + (1-beta)*g*g
    bc1 = 1 - alpha**t, bc2 = 1 - beta**t     (both 1 without bias correction)
    r = lambda*w + (m/bc1) / (sqrt(v/bc2) + epsilon)
    per element where r is not finite: r = 0 and m, v keep their old values
    ratio = clamp(sqrt(sum(w*w) / sum(r*r)), ratio_min, ratio_max)   (1 when either sum is 0)
    w_new = w - (lr*ratio) * r ;  w = w_new where it is finite (an element stays put otherwise)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ort_torch_train.optim.float32 import to_float32


@torch.no_grad()
def lamb(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    *,
    lr: float,
    step: int,
    alpha: float,
    beta: float,
    lambda_: float,
    epsilon: float,
    ratio_min: float = float("-inf"),
    ratio_max: float = float("inf"),
    do_bias_correction: bool = False,
    grad_scale: Tensor | None = None,
) -> None:
    """Apply one LambOptimizer update in place to ``params``, ``exp_avgs`` and ``exp_avg_sqs``.

    ``grads`` are left unchanged. Moments may be float16 (``use_fp16_moments``): the math runs in float32.
    """
    counts = {len(params), len(grads), len(exp_avgs), len(exp_avg_sqs)}
    if len(counts) != 1 or not params:
        raise ValueError("lamb: params, grads, exp_avgs and exp_avg_sqs must be non-empty lists of one length")
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"lamb: step must be an int >= 1; got {step!r}")
    bc1 = to_float32(1.0 - alpha**step) if do_bias_correction else 1.0
    bc2 = to_float32(1.0 - beta**step) if do_bias_correction else 1.0
    one_minus_alpha, one_minus_beta = to_float32(1.0 - alpha), to_float32(1.0 - beta)
    for w, g, m_state, v_state in zip(params, grads, exp_avgs, exp_avg_sqs):
        g = g.float() if grad_scale is None else g.float() / grad_scale
        m = m_state.float() * alpha + g * one_minus_alpha
        v = v_state.float() * beta + g * one_minus_beta * g
        direction = w * lambda_ + (m / bc1) / ((v / bc2).sqrt() + epsilon)  # lambda 0 too: an inf w is nan
        finite = direction.isfinite()
        direction = torch.where(finite, direction, 0.0)
        w_squares, r_squares = w.square().sum(), direction.square().sum()
        ratio = (w_squares / r_squares).sqrt().clamp(min=ratio_min, max=ratio_max)
        ratio = torch.where((w_squares != 0) & (r_squares != 0), ratio, torch.ones_like(ratio))
        updated = w - direction * (ratio * to_float32(lr))
        w.copy_(torch.where(updated.isfinite(), updated, w))
        m_state.copy_(torch.where(finite, m, m_state))
        v_state.copy_(torch.where(finite, v, v_state))
