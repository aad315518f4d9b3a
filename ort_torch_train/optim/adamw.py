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
"fused" maps them onto ``torch._fused_adamw_`` (per-step scalars) and differs by float rounding only
(both multi-tensor implementations live in ``adamw_multi_tensor.py``). ``ADAMW_ALGORITHM`` is the
op's record (``adamw_record.py``).
The one op that is not bit-exact to ORT's CPU kernel is sqrt: ORT uses Eigen's fast-math
approximation (rsqrtps + one Newton step), torch's CPU float32 sqrt is within 0.75 ulp.
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import MutableSequence, Sequence
from typing import Generic, NamedTuple, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

from ort_torch_train.optim.adamw_multi_tensor import fused_adamw, fused_kernel_accepts, multi_tensor_adamw
from ort_torch_train.optim.adamw_record import ADAMW_ALGORITHM as ADAMW_ALGORITHM  # re-exported: imported here too
from ort_torch_train.optim.adamw_record import ATTRIBUTE_DEFAULTS as ATTRIBUTE_DEFAULTS
from ort_torch_train.optim.adamw_record import IMPLEMENTATIONS, AdamWHyperparameters, own_hyperparameters
from ort_torch_train.optim.adamw_record import hyperparameters_from_attributes as hyperparameters_from_attributes
from ort_torch_train.optim.algorithm import Hyperparameters, PreparedKernel
from ort_torch_train.optim.compiled import FusedUpdate, compiled, scalar_tensor
from ort_torch_train.optim.float32 import to_float32

Scalar = TypeVar("Scalar", float, Tensor)
_FLOAT32_PAIR = struct.Struct("2f")


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
    powers = (beta1**step, beta2**step)
    try:  # both at once, each rounded to float32 as it is packed (as to_float32 rounds it)
        power1, power2 = _FLOAT32_PAIR.unpack(_FLOAT32_PAIR.pack(*powers))
        bias_correction1, bias_correction2 = _FLOAT32_PAIR.unpack(_FLOAT32_PAIR.pack(1.0 - power1, 1.0 - power2))
    except OverflowError:  # finite beyond float32's range: to_float32 gives the infinity ORT's cast does
        bias_correction1 = to_float32(1.0 - to_float32(powers[0]))
        bias_correction2 = to_float32(1.0 - to_float32(powers[1]))
    ratio = to_float32(to_float32(math.sqrt(bias_correction2)) / bias_correction1)
    return bias_correction1, bias_correction2, to_float32(lr * ratio)


def adamw_step_scalars(hyperparameters: AdamWHyperparameters, step: int) -> AdamWStepScalars[float]:
    """The scalars of the 1-based ``step`` as ORT computes them from float32 hyperparameters."""
    h = hyperparameters
    bias_correction1, bias_correction2, corrected_lr = ort_step_scalars(step, h.lr, h.beta1, h.beta2, h.correct_bias)
    one_minus_beta1, one_minus_beta2, decay_after = h.step_constants
    return AdamWStepScalars(  # positional: a NamedTuple built from keywords costs more, at every step
        h.lr,
        h.beta1,
        one_minus_beta1,
        h.beta2,
        one_minus_beta2,
        h.eps,
        bias_correction1,
        bias_correction2,
        corrected_lr,
        h.weight_decay,
        decay_after,
    )


class AdamWHostScalars:
    """``AdamWStepScalars`` in one host float32 tensor, rewritten in place (``HostStepScalars``): every value when the
    hyperparameters change, then at each step only the bias corrections and the corrected learning rate.

    Each of those is rounded to float32 where ``ort_step_scalars`` rounds it, by storing it in its float32 slot of
    the buffer (C's cast: to the nearest, a finite value past float32's range giving the infinity ORT's cast gives)
    and reading it back: the same values, bit for bit.
    """

    __slots__ = ("_betas", "_hyperparameters", "_lr", "_slots", "tensor")

    def __init__(self) -> None:
        array = np.zeros(len(AdamWStepScalars._fields), np.float32)
        self.tensor = torch.from_numpy(array)
        # float32 items, read and written as Python floats (typeshed types a memoryview's items as int)
        self._slots = cast("MutableSequence[float]", array.data)
        self._hyperparameters: AdamWHyperparameters | None = None
        self._betas: tuple[float, float] | None = None  # None: no bias correction, no value changes with the step
        self._lr = 0.0

    def write(self, hyperparameters: Hyperparameters, step: int) -> Tensor:
        """The tensor, holding the scalars of the 1-based ``step`` for ``hyperparameters``."""
        if hyperparameters is not self._hyperparameters:
            self._prepare(own_hyperparameters(hyperparameters))
        betas = self._betas
        if betas is not None:  # slots 6, 7, 8: bias_correction1, bias_correction2, corrected_lr
            slots = self._slots
            slots[6] = betas[0] ** step
            slots[7] = betas[1] ** step
            slots[6] = 1.0 - slots[6]
            slots[7] = 1.0 - slots[7]
            slots[8] = math.sqrt(slots[7])
            slots[8] = slots[8] / slots[6]
            slots[8] = self._lr * slots[8]
        return self.tensor

    def _prepare(self, hyperparameters: AdamWHyperparameters) -> None:
        slots = self._slots
        for index, value in enumerate(adamw_step_scalars(hyperparameters, 1)):
            slots[index] = value
        self._hyperparameters = hyperparameters
        self._betas = (hyperparameters.beta1, hyperparameters.beta2) if hyperparameters.correct_bias else None
        self._lr = hyperparameters.lr


def choose_adamw_implementation(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor]
) -> str:
    """Return "fused" when ``torch._fused_adamw_`` can run these tensors, else "foreach"."""
    return "fused" if fused_kernel_accepts(params, grads, exp_avgs, exp_avg_sqs) else "foreach"


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
    elif implementation == "fused" and not fused_kernel_accepts(params, grads, exp_avgs, exp_avg_sqs):
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
        if implementation == "fused" and fused_adamw(
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
            multi_tensor_adamw(params, grads, exp_avgs, exp_avg_sqs, scalars, *constants, scratch=scratch)


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


# ---- the kernels of ADAMW_ALGORITHM (adamw_record.py), called through the record -----------------------
def kernel_default_implementation(params: list[Tensor], grads: list[Tensor], moments: list[list[Tensor]]) -> str:
    exp_avgs, exp_avg_sqs = moments
    return choose_adamw_implementation(params, grads, exp_avgs, exp_avg_sqs)


def kernel_update(
    params: list[Tensor],
    grads: list[Tensor],
    moments: list[list[Tensor]],
    hyperparameters: Hyperparameters,
    step: int,
    kernel: PreparedKernel,
) -> None:
    exp_avgs, exp_avg_sqs = moments
    adamw_prepared(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        own_hyperparameters(hyperparameters),
        step=step,
        implementation=kernel.implementation,
        scratch=kernel.scratch,
        step_tensor=kernel.step_tensor,
    )


def kernel_fused_update(hyperparameters: Hyperparameters, clip_max_norm: float | None) -> FusedUpdate:
    h = own_hyperparameters(hyperparameters)
    return FusedUpdate(single_tensor_adamw, (h.adam_mode, h.weight_decay != 0.0), clip_max_norm)


def kernel_step_scalars(hyperparameters: Hyperparameters, step: int) -> Sequence[float]:
    return adamw_step_scalars(own_hyperparameters(hyperparameters), step)


def kernel_host_step_scalars() -> AdamWHostScalars:
    return AdamWHostScalars()
