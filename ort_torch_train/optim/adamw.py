"""ORT's ``com.microsoft.AdamWOptimizer`` as in-place torch kernels.

Reference: onnxruntime ``orttraining/training_ops/cpu/optimizer/adamw/adamw.cc`` (1.19.2). With
t = step, every scalar in float32 (``std::pow(float, int64)`` is evaluated in double, then cast):

    bc1 = 1 - float(beta1**t),  bc2 = 1 - float(beta2**t)     (both 1 when correct_bias is 0)
    lr_corrected = lr * (sqrt(bc2) / bc1)
    m = beta1*m + (1-beta1)*g ;  v = beta2*v + ((1-beta2)*g)*g
    mode 0 (torch AdamW): w = w - (w*lr)*wd ; w = w - (lr*m) / (bc1 * (sqrt(v/bc2) + eps))
    mode 1 (HF AdamW):    w = w - (lr_corrected*m) / (sqrt(v) + eps) ; w = w - (lr*wd)*w

One functional entry, ``adamw``, runs one of four implementations. "single" (``single_tensor_adamw``,
a per-tensor loop; also the kernel that torch.compile runs: "compiled", and a compiled train step)
and "foreach" perform exactly these float32 operations in this order (no fused multiply-add);
"fused" maps them onto ``torch._fused_adamw_`` (per-step scalars) and differs by float rounding only.
The one op that is not bit-exact to ORT's CPU kernel is sqrt: ORT uses Eigen's fast-math
approximation (rsqrtps + one Newton step), torch's CPU float32 sqrt is within 0.75 ulp.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import torch
from torch import Tensor

from ort_torch_train.optim.compiled import compiled, scalar_tensor
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.scratch import scaled_copy

IMPLEMENTATIONS = ("fused", "foreach", "single", "compiled")
_FUSED_DEVICE_TYPES = ("cpu", "cuda")
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LARGEST_EXACT_FLOAT32_STEP = 2**24  # the fused kernel reads the step from a float32 tensor


@dataclass(frozen=True)
class AdamWHyperparameters:
    """The learning rate and the AdamWOptimizer node's attributes (beta1/beta2 are ORT's alpha/beta)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    adam_mode: int  # 0: torch AdamW, 1: HF AdamW
    correct_bias: bool

    def float32(self) -> AdamWHyperparameters:
        """These hyperparameters with every float rounded to float32, as ORT uses them."""
        return dataclasses.replace(
            self,
            lr=to_float32(self.lr),
            beta1=to_float32(self.beta1),
            beta2=to_float32(self.beta2),
            eps=to_float32(self.eps),
            weight_decay=to_float32(self.weight_decay),
        )

    def check(self) -> None:
        """Raise ValueError where ORT's kernel would refuse these values."""
        for name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"adamw: {name} must be in [0, 1) as a float32; got {beta!r}")
        if self.adam_mode not in (0, 1):
            raise ValueError(f"adamw: adam_mode must be 0 (torch AdamW) or 1 (HF AdamW); got {self.adam_mode!r}")
        if self.adam_mode == 0 and not self.correct_bias:
            raise ValueError("adamw: adam_mode 0 requires correct_bias (as in ORT); got correct_bias=False")


Scalar = TypeVar("Scalar", float, Tensor)


class AdamWStepScalars(NamedTuple, Generic[Scalar]):
    """One step's scalars as the kernels read them: float32 values, or 0-d tensors of them (compiled)."""

    lr: Scalar
    beta1: Scalar
    one_minus_beta1: Scalar
    beta2: Scalar
    one_minus_beta2: Scalar
    eps: Scalar
    bias_correction1: Scalar
    bias_correction2: Scalar
    corrected_lr: Scalar
    weight_decay: Scalar
    decay_after: Scalar  # lr * weight_decay, the HF mode's decay


def ort_step_scalars(
    step: int, lr: float, beta1: float, beta2: float, correct_bias: bool
) -> tuple[float, float, float]:
    """Return ``(bias_correction1, bias_correction2, corrected_lr)`` as ORT computes them in float32."""
    if not correct_bias:
        return 1.0, 1.0, lr
    bias_correction1 = to_float32(1.0 - to_float32(beta1**step))
    bias_correction2 = to_float32(1.0 - to_float32(beta2**step))
    ratio = to_float32(to_float32(math.sqrt(bias_correction2)) / bias_correction1)
    return bias_correction1, bias_correction2, to_float32(lr * ratio)


def adamw_step_scalars(hyperparameters: AdamWHyperparameters, step: int) -> AdamWStepScalars[float]:
    """The scalars of the 1-based ``step`` as ORT computes them from float32 hyperparameters."""
    h = hyperparameters
    bias_correction1, bias_correction2, corrected_lr = ort_step_scalars(step, h.lr, h.beta1, h.beta2, h.correct_bias)
    return AdamWStepScalars(
        lr=h.lr,
        beta1=h.beta1,
        one_minus_beta1=to_float32(1.0 - h.beta1),
        beta2=h.beta2,
        one_minus_beta2=to_float32(1.0 - h.beta2),
        eps=h.eps,
        bias_correction1=bias_correction1,
        bias_correction2=bias_correction2,
        corrected_lr=corrected_lr,
        weight_decay=h.weight_decay,
        decay_after=to_float32(h.lr * h.weight_decay),
    )


def choose_adamw_implementation(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor]
) -> str:
    """Return "fused" when ``torch._fused_adamw_`` can run these tensors, else "foreach"."""
    return "fused" if _fused_kernel_accepts(params, grads, exp_avgs, exp_avg_sqs) else "foreach"


def adamw(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    hyperparameters: AdamWHyperparameters,
    *,
    step: int,
    implementation: str | None = None,
    scratch: tuple[list[Tensor], ...] | None = None,
) -> None:
    """Apply one ORT AdamWOptimizer update in place to ``params``, ``exp_avgs`` and ``exp_avg_sqs``.

    ``step`` is the 1-based step fed to ORT's node. Hyperparameters are used as float32, as in ORT.
    ``implementation``: "fused", "foreach", "single", "compiled" (the single-tensor kernel through
    torch.compile) or None (fused when possible, else foreach).
    "fused" falls back to "foreach" for steps whose scalars it cannot express (lr' == 0, step > 2**24).
    ``scratch`` (two lists from ``make_scratch(params, 2)``) lets "foreach" run without allocating temporaries.
    """
    hyperparameters = hyperparameters.float32()
    _check_tensors(params, grads, exp_avgs, exp_avg_sqs)
    if implementation not in (None, *IMPLEMENTATIONS):
        raise ValueError(f"adamw: implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")
    if not isinstance(step, numbers.Integral) or isinstance(step, bool) or step < 1:
        raise ValueError(f"adamw: step must be an int >= 1 (completed steps + 1); got {step!r}")
    hyperparameters.check()
    if implementation is None:
        implementation = choose_adamw_implementation(params, grads, exp_avgs, exp_avg_sqs)
    elif implementation == "fused" and not _fused_kernel_accepts(params, grads, exp_avgs, exp_avg_sqs):
        raise ValueError(
            "adamw: implementation 'fused' needs all tensors on one cpu or cuda device with "
            f"one floating dtype; got devices {_devices(params)} and dtypes {_dtypes(params)}"
        )
    adamw_prepared(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        hyperparameters,
        step=int(step),
        implementation=implementation,
        scratch=scratch,
    )


def adamw_prepared(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    hyperparameters: AdamWHyperparameters,
    *,
    step: int,
    implementation: str,
    scratch: tuple[list[Tensor], ...] | None = None,
    step_tensor: Tensor | None = None,
) -> None:
    """``adamw`` without the argument checks, for callers that validated once (the optimizer engine).

    ``implementation`` must be a concrete choice that accepts these tensors. ``step_tensor`` (a
    float32 scalar on the params' device) is reused by "fused" instead of allocating one per step.
    """
    with torch.no_grad():
        if implementation == "fused" and _fused_adamw(
            params, grads, exp_avgs, exp_avg_sqs, hyperparameters, step, step_tensor
        ):
            return
        scalars = adamw_step_scalars(hyperparameters, step)
        constants = (hyperparameters.adam_mode, hyperparameters.weight_decay != 0.0)
        if implementation == "single":
            single_tensor_adamw(params, grads, exp_avgs, exp_avg_sqs, scalars, *constants)
        elif implementation == "compiled":
            compiled(single_tensor_adamw)(
                params, grads, exp_avgs, exp_avg_sqs, scalar_tensor(scalars, params[0].device), *constants
            )
        else:
            _multi_tensor_adamw(params, grads, exp_avgs, exp_avg_sqs, scalars, *constants, scratch=scratch)


def single_tensor_adamw(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    scalars: AdamWStepScalars[float] | Tensor,
    adam_mode: int,
    decays: bool,
) -> None:
    """ORT's AdamW in its float32 op order, one tensor at a time (traceable by torch.compile).

    ``scalars``: the step's ``AdamWStepScalars``, or one float32 tensor of their values in that order
    (compiled: the values change without a recompilation). ``decays``: whether weight decay is not 0.
    """
    s = AdamWStepScalars(*scalars.unbind()) if isinstance(scalars, Tensor) else scalars
    for w, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        if adam_mode == 0 and decays:
            w.sub_(w * s.lr * s.weight_decay)
        m.mul_(s.beta1).add_(g * s.one_minus_beta1)
        v.mul_(s.beta2).add_(g * s.one_minus_beta2 * g)
        if adam_mode == 0:
            w.sub_(m * s.lr / ((v / s.bias_correction2).sqrt_().add_(s.eps) * s.bias_correction1))
        else:
            w.sub_(m * s.corrected_lr / v.sqrt().add_(s.eps))
            if decays:
                w.sub_(w * s.decay_after)


def _multi_tensor_adamw(
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


def _fused_adamw(
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


def _fused_kernel_accepts(*tensor_lists: list[Tensor]) -> bool:
    first = tensor_lists[0][0]
    if first.device.type not in _FUSED_DEVICE_TYPES or first.dtype not in _FUSED_DTYPES:
        return False
    return all(t.device == first.device and t.dtype == first.dtype for ts in tensor_lists for t in ts)


def _check_tensors(*tensor_lists: list[Tensor]) -> None:
    counts = tuple(len(tensors) for tensors in tensor_lists)
    if counts[0] == 0 or len(set(counts)) != 1:
        raise ValueError(
            "adamw: params, grads, exp_avgs and exp_avg_sqs must be non-empty lists of one "
            f"length; got lengths {counts}"
        )


def _devices(tensors: list[Tensor]) -> list[str]:
    return sorted({str(t.device) for t in tensors})


def _dtypes(tensors: list[Tensor]) -> list[str]:
    return sorted({str(t.dtype) for t in tensors})
