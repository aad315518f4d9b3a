"""The legacy per-weight ``com.microsoft.LambOptimizer`` (``training_optimizer_name="LambOptimizer"``).

Attributes per weight from ``optimizer_attributes_map``/``optimizer_int_attributes_map`` over the
schema defaults: alpha 0.9, beta 0.999, lambda 0, epsilon 1e-6, max_norm_clip 1, ratio_min -inf,
ratio_max inf, do_bias_correction 0. State and checkpoint names are Adam's (``Moment_1_<w>``,
``Moment_2_<w>``, ``Update_Count_<w>``, counting from 1). The math is ``optim.lamb``; with gradient
clipping the gradients are divided by ``norm / max_norm_clip`` when the global norm exceeds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ort_torch_train.legacy.optimizers import Adam
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.lamb import lamb

LAMB_FLOAT_DEFAULTS = {
    "alpha": 0.9,
    "beta": 0.999,
    "lambda": 0.0,
    "epsilon": 1e-6,
    "max_norm_clip": 1.0,
    "ratio_min": float("-inf"),
    "ratio_max": float("inf"),
}
LAMB_INT_DEFAULTS = {"do_bias_correction": 0}


@dataclass(frozen=True)
class LambAttributes:
    """One LambOptimizer node's attributes (floats rounded to float32)."""

    alpha: float
    beta: float
    lambda_: float
    epsilon: float
    max_norm_clip: float
    ratio_min: float
    ratio_max: float
    do_bias_correction: bool


def lamb_attributes(weight: str, floats: Mapping[str, float], ints: Mapping[str, int]) -> LambAttributes:
    """The attributes of ``weight``'s node over the defaults, checked."""
    values = {**{k: to_float32(v) for k, v in LAMB_FLOAT_DEFAULTS.items()}, **LAMB_INT_DEFAULTS}
    values.update({k: to_float32(v) for k, v in floats.items() if k in LAMB_FLOAT_DEFAULTS})
    values.update({k: int(v) for k, v in ints.items() if k in LAMB_INT_DEFAULTS})
    for name in ("alpha", "beta", "lambda", "epsilon"):
        if not values[name] >= 0:
            raise ValueError(f"LambOptimizer for weight {weight!r}: attribute {name} must be >= 0, got {values[name]}")
    if values["ratio_min"] > values["ratio_max"]:
        raise ValueError(
            f"LambOptimizer for weight {weight!r}: ratio_min {values['ratio_min']} exceeds "
            f"ratio_max {values['ratio_max']}"
        )
    if values["do_bias_correction"] not in (0, 1):
        raise ValueError(
            f"LambOptimizer for weight {weight!r}: do_bias_correction must be 0 or 1, "
            f"got {values['do_bias_correction']}"
        )
    return LambAttributes(
        values["alpha"],
        values["beta"],
        values["lambda"],
        values["epsilon"],
        values["max_norm_clip"],
        values["ratio_min"],
        values["ratio_max"],
        bool(values["do_bias_correction"]),
    )


class Lamb(Adam):
    """LambOptimizer for each trained weight (state handling shared with Adam)."""

    def step(self, learning_rate: float, grad_norm: Tensor | None = None) -> None:
        """One update from the accumulated gradients (``grad_norm`` needed when clipping is on)."""
        if self.clip_grad_norm and grad_norm is None:
            raise ValueError("Lamb.step: gradient clipping is enabled but no global gradient norm was given")
        for name, param in self.params.items():
            a = self.attributes[name]
            scale = None
            if self.clip_grad_norm:
                scale = torch.where(
                    grad_norm > a.max_norm_clip, grad_norm / a.max_norm_clip, torch.ones_like(grad_norm)
                )
            lamb(
                [param],
                [param.grad],
                [self.moments[name][0]],
                [self.moments[name][1]],
                lr=learning_rate,
                step=self.update_counts[name],
                alpha=a.alpha,
                beta=a.beta,
                lambda_=a.lambda_,
                epsilon=a.epsilon,
                ratio_min=a.ratio_min,
                ratio_max=a.ratio_max,
                do_bias_correction=a.do_bias_correction,
                grad_scale=scale,
            )
            self.update_counts[name] += 1
