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

from torch import Tensor

from ort_torch_train.legacy.moments import NodeAttributes, PerWeightMoments, clip_divisor, node_attributes
from ort_torch_train.optim.lamb import lamb
from ort_torch_train.optim.tensor_lists import gradient_buffers

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
class LambAttributes(NodeAttributes):
    """One LambOptimizer node's attributes."""

    ratio_min: float
    ratio_max: float
    do_bias_correction: bool


def lamb_attributes(weight: str, floats: Mapping[str, float], ints: Mapping[str, int]) -> LambAttributes:
    """The attributes of ``weight``'s node over the defaults, checked."""
    attributes = node_attributes(
        LambAttributes, "LambOptimizer", weight, floats, ints, LAMB_FLOAT_DEFAULTS, LAMB_INT_DEFAULTS
    )
    if attributes.ratio_min > attributes.ratio_max:
        raise ValueError(
            f"LambOptimizer for weight {weight!r}: ratio_min {attributes.ratio_min} exceeds "
            f"ratio_max {attributes.ratio_max}"
        )
    return attributes


class Lamb(PerWeightMoments[LambAttributes]):
    """LambOptimizer for each trained weight: one update per weight (its trust ratio is per tensor)."""

    def step(self, learning_rate: float, grad_norm: Tensor | None = None) -> None:
        """One update from the accumulated gradients (``grad_norm`` needed when clipping is on)."""
        norm = self._clip_norm(grad_norm)
        params = list(self.params.values())
        for name, param, grad in zip(self.params, params, gradient_buffers(params)):
            a = self.attributes[name]
            lamb(
                [param],
                [grad],
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
                grad_scale=None if norm is None else clip_divisor(norm, a.max_norm_clip),
            )
            self.update_counts[name] += 1
