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
op's record (``optim/algorithm.py``).
The one op that is not bit-exact to ORT's CPU kernel is sqrt: ORT uses Eigen's fast-math
approximation (rsqrtps + one Newton step), torch's CPU float32 sqrt is within 0.75 ulp.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import torch
from torch import Tensor

from ort_torch_train.errors import ModelError
from ort_torch_train.optim.adamw_multi_tensor import fused_adamw, fused_kernel_accepts, multi_tensor_adamw
from ort_torch_train.optim.algorithm import (
    DEFAULT_LEARNING_RATE,
    AttributeValue,
    Hyperparameters,
    OptimizerAlgorithm,
    PreparedKernel,
)
from ort_torch_train.optim.compiled import FusedUpdate, compiled, scalar_tensor
from ort_torch_train.optim.float32 import to_float32

IMPLEMENTATIONS = ("fused", "foreach", "single", "compiled")


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

    def with_learning_rate(self, lr: float) -> AdamWHyperparameters:
        """These hyperparameters with another learning rate."""
        return dataclasses.replace(self, lr=lr)

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


# ---- the record of com.microsoft.AdamWOptimizer ------------------------------------------------
_INPUTS = ("learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments")
# Defaults of missing attributes: ORT fills them from the op SCHEMA (training_op_defs.cc) before the
# kernel reads them, so weight_decay defaults to 0.01 (the schema), not 0 (adamwbase.h). Observed
# with onnxruntime-training 1.19.2; floats are float32 attributes.
ATTRIBUTE_DEFAULTS: dict[str, AttributeValue] = {
    "alpha": to_float32(0.9),
    "beta": to_float32(0.999),
    "epsilon": to_float32(1e-8),
    "weight_decay": to_float32(0.01),
    "adam_mode": 0,
    "correct_bias": 1,
}


def hyperparameters_from_attributes(attributes: Mapping[str, AttributeValue]) -> AdamWHyperparameters:
    """The kernel's hyperparameters (at the default learning rate) from every AdamWOptimizer attribute;
    ModelError for values ORT's kernel refuses."""
    op = "optimizer model: AdamWOptimizer"
    floats = {name: float(attributes[name]) for name in ("alpha", "beta", "epsilon", "weight_decay")}
    ints = {name: int(attributes[name]) for name in ("adam_mode", "correct_bias")}
    for name in ("alpha", "beta"):
        if not 0.0 <= floats[name] < 1.0:
            raise ModelError(f"{op} attribute {name} must be in [0, 1); found {floats[name]}")
    for name in ("epsilon", "weight_decay"):
        if not (math.isfinite(floats[name]) and floats[name] >= 0.0):
            raise ModelError(f"{op} attribute {name} must be finite and >= 0; found {floats[name]}")
    for name in ("adam_mode", "correct_bias"):
        if ints[name] not in (0, 1):
            raise ModelError(f"{op} attribute {name} must be 0 or 1; found {ints[name]}")
    if ints["adam_mode"] == 0 and ints["correct_bias"] != 1:
        raise ModelError(f"{op} with adam_mode 0 (torch AdamW) requires correct_bias 1; found correct_bias 0")
    return AdamWHyperparameters(
        lr=DEFAULT_LEARNING_RATE,
        beta1=floats["alpha"],
        beta2=floats["beta"],
        eps=floats["epsilon"],
        weight_decay=floats["weight_decay"],
        adam_mode=ints["adam_mode"],
        correct_bias=bool(ints["correct_bias"]),
    )


def _own(hyperparameters: Hyperparameters) -> AdamWHyperparameters:
    if not isinstance(hyperparameters, AdamWHyperparameters):
        raise TypeError(f"adamw: expected AdamWHyperparameters; got {type(hyperparameters).__name__}")
    return hyperparameters


def _reported(hyperparameters: Hyperparameters) -> dict[str, float | int | bool]:
    h = _own(hyperparameters)
    return {
        "beta1": h.beta1,
        "beta2": h.beta2,
        "epsilon": h.eps,
        "weight_decay": h.weight_decay,
        "adam_mode": h.adam_mode,
        "correct_bias": h.correct_bias,
    }


def _default_implementation(params: list[Tensor], grads: list[Tensor], moments: list[list[Tensor]]) -> str:
    exp_avgs, exp_avg_sqs = moments
    return choose_adamw_implementation(params, grads, exp_avgs, exp_avg_sqs)


def _update(
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
        _own(hyperparameters),
        step=step,
        implementation=kernel.implementation,
        scratch=kernel.scratch,
        step_tensor=kernel.step_tensor,
    )


def _fused_update(hyperparameters: Hyperparameters, clip_max_norm: float | None) -> FusedUpdate:
    h = _own(hyperparameters)
    return FusedUpdate(single_tensor_adamw, (h.adam_mode, h.weight_decay != 0.0), clip_max_norm)


def _step_scalars(hyperparameters: Hyperparameters, step: int) -> Sequence[float]:
    return adamw_step_scalars(_own(hyperparameters), step)


ADAMW_ALGORITHM = OptimizerAlgorithm(
    op_type="AdamWOptimizer",
    display_name="AdamW",
    name="adamw",
    graph_inputs=_INPUTS,
    node_inputs=_INPUTS,
    attribute_defaults=ATTRIBUTE_DEFAULTS,
    make_hyperparameters=hyperparameters_from_attributes,
    reported=_reported,
    stored_moments=("momentum0", "momentum1"),
    updated_moments=("momentum0", "momentum1"),
    implementations=IMPLEMENTATIONS,
    default_implementation=_default_implementation,
    update=_update,
    scratch_lists=2,
    fused_update=_fused_update,
    step_scalars=_step_scalars,
    elementwise=True,
)
