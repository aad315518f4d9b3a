"""The legacy per-weight optimizers ``com.microsoft.SGDOptimizer`` and ``AdamOptimizer`` over torch tensors,
and ``build_optimizer`` for them and ``LambOptimizer`` (``legacy/lamb.py``), which selects one through
``LEGACY_OPTIMIZERS``: a record per op of the attributes it reads and its builder.

Graph construction (ORT 1.13, ``core/graph/optimizer/*_optimizer_builder.cc``): one node per trained
weight; the learning rate is the graph input ``lr_params_feed_name`` (float[1]); Adam keeps per-weight
initializers ``Update_Count_<w>`` (int64[1], starts at 1), ``Moment_1_<w>`` and ``Moment_2_<w>`` (zeros),
optionally seeded by ``set_optimizer_initial_state``; the node attributes come from the per-weight
``optimizer_attributes_map`` (floats) and ``optimizer_int_attributes_map`` (ints), over the schema
defaults (``training_op_defs.cc``): alpha 0.9, beta 0.999, lambda 0, epsilon 1e-8, max_norm_clip 1,
do_bias_correction 1, weight_decay_mode 0.

Kernels, all in float32 (``training_ops/cpu/optimizer/optimizers.cc``, ``cuda/optimizer/adam.cu``),
with bc1 = 1 - alpha^t and bc2 = 1 - beta^t (t = Update_Count, both 1 without bias correction):

    SGD:     w = w + (-lr * g)                       (identical to SGDOptimizerV2: reuses optim.sgd)
    Adam:    g = g / s  (enable_grad_norm_clip) where s = norm / max_norm_clip if the global norm
             of all trained gradients exceeds max_norm_clip, else 1
             m = alpha*m + (1-alpha)*g ;  v = beta*v + ((1-beta)*g)*g
      mode 0 (PyTorch AdamW):     w = w + (-lr) * ((m/bc1) / (sqrt(v/bc2) + eps) + lambda*w)
      mode 1 (HuggingFace AdamW): u = (lr*sqrt(bc2)/bc1) * m / (sqrt(v) + eps) ;
                                  w = w + (-u - (lr*lambda) * (w - u))
             Update_Count += 1

Adam has its own kernel rather than ``optim.adamw`` (the same math up to rounding): the legacy
operation order, per-weight attributes and counters, mode 0 without bias correction and the gradient
scaling differ. The scaling by the global norm is the CUDA kernel's; ORT's CPU kernel ignores the norm.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch
from torch import Tensor

from ort_torch_train.legacy.lamb import LAMB_FLOAT_DEFAULTS, LAMB_INT_DEFAULTS, Lamb, lamb_attributes
from ort_torch_train.legacy.moments import InitialState, NodeAttributes, PerWeightMoments, clip_divisor, node_attributes
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.sgd import SGDHyperparameters, sgd
from ort_torch_train.optim.tensor_lists import gradient_buffers

ADAM_FLOAT_DEFAULTS = {"alpha": 0.9, "beta": 0.999, "lambda": 0.0, "epsilon": 1e-8, "max_norm_clip": 1.0}
ADAM_INT_DEFAULTS = {"do_bias_correction": 1, "weight_decay_mode": 0}
LegacyOptimizer: TypeAlias = "SGD | Adam | Lamb"


@dataclass(frozen=True)
class AdamAttributes(NodeAttributes):
    """One AdamOptimizer node's attributes."""

    do_bias_correction: bool
    weight_decay_mode: int


@dataclass(frozen=True)
class LegacyArguments:
    """What a legacy optimizer is built from (``build_optimizer``'s arguments, checked)."""

    params: Mapping[str, torch.nn.Parameter]
    float_attributes: Mapping[str, Mapping[str, float]]
    int_attributes: Mapping[str, Mapping[str, int]]
    initial_state: InitialState
    clip_grad_norm: bool
    fp16_moments: bool


@dataclass(frozen=True)
class LegacyAlgorithm:
    """One legacy optimizer op: the node attributes it reads (with their schema defaults) and its builder."""

    float_defaults: Mapping[str, float]
    int_defaults: Mapping[str, int]
    build: Callable[[LegacyArguments], LegacyOptimizer]


def adam_attributes(weight: str, floats: Mapping[str, float], ints: Mapping[str, int]) -> AdamAttributes:
    """The attributes of ``weight``'s node, checked like ORT's kernel constructor."""
    return node_attributes(
        AdamAttributes, "AdamOptimizer", weight, floats, ints, ADAM_FLOAT_DEFAULTS, ADAM_INT_DEFAULTS
    )


def build_optimizer(
    name: str,
    params: Mapping[str, torch.nn.Parameter],
    float_attributes: Mapping[str, Mapping[str, float]],
    int_attributes: Mapping[str, Mapping[str, int]],
    initial_state: InitialState,
    clip_grad_norm: bool,
    fp16_moments: bool = False,
    all_weights: Sequence[str] | None = None,
) -> LegacyOptimizer:
    """The optimizer ``name`` (``training_optimizer_name``, not "") names over the trained ``params``.

    ``fp16_moments`` stores Adam's and Lamb's moments in float16. As in ORT, both attribute maps need
    an entry for every trained weight (``all_weights`` when ``params`` are slices of some of them). Attribute names the
    optimizer does not read are ignored, as ORT does, with a warning.
    """
    if name not in LEGACY_OPTIMIZERS:
        raise ValueError(f"build_optimizer: no legacy optimizer {name!r}; expected one of {list(LEGACY_OPTIMIZERS)}")
    algorithm = LEGACY_OPTIMIZERS[name]
    for weight in all_weights if all_weights is not None else params:
        for what, maps in (("attribute", float_attributes), ("int attribute", int_attributes)):
            if weight not in maps:
                raise ValueError(
                    f"Failed to find {what} map for weight {weight}: TrainingParameters."
                    f"optimizer_{what.replace(' ', '_')}s_map needs an entry (a dict, maybe "
                    "empty) for every trained weight"
                )
    _check_attribute_names(
        name, float_attributes, algorithm.float_defaults, algorithm.int_defaults, "optimizer_attributes_map"
    )
    _check_attribute_names(
        name, int_attributes, algorithm.int_defaults, algorithm.float_defaults, "optimizer_int_attributes_map"
    )
    return algorithm.build(
        LegacyArguments(params, float_attributes, int_attributes, initial_state, clip_grad_norm, fp16_moments)
    )


def _check_attribute_names(
    optimizer: str,
    maps: Mapping[str, Mapping[str, object]],
    known: Mapping[str, object],
    other: Mapping[str, object],
    where: str,
) -> None:
    names = {key for attributes in maps.values() for key in attributes}
    misplaced = sorted(names & set(other))
    if misplaced:
        raise ValueError(
            f"TrainingParameters.{where}: {misplaced} belong in the other attribute map "
            f"(floats: {sorted(ADAM_FLOAT_DEFAULTS)}, ints: {sorted(ADAM_INT_DEFAULTS)})"
        )
    ignored = sorted(names - set(known))
    if ignored:
        warnings.warn(
            f"TrainingParameters.{where}: {optimizer} reads no attribute {ignored}; they are "
            f"ignored (as in ORT). It reads {sorted(known) or 'none'}.",
            stacklevel=4,
        )


class SGD:
    """SGDOptimizer for each trained weight: no state, no gradient clipping (ORT's SGD builder has none)."""

    clip_grad_norm = False

    def __init__(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        self.params = dict(params)

    def step(self, learning_rate: float, grad_norm: Tensor | None = None) -> None:
        """One update from the accumulated gradients (``grad_norm`` is unused, as in ORT)."""
        params: list[Tensor] = list(self.params.values())
        sgd(params, gradient_buffers(params), SGDHyperparameters(learning_rate))

    def state_tensors(self) -> dict[str, Tensor]:
        """ORT's optimizer-state initializers: none for SGD."""
        return {}

    def optimizer_state(self) -> dict[str, dict[str, Tensor]]:
        """``get_optimizer_state()``'s content: empty for SGD."""
        return {}

    def load_state_tensor(self, name: str, value: object) -> bool:
        """Load one optimizer-state tensor; False when ``name`` is not one."""
        return False


class Adam(PerWeightMoments[AdamAttributes]):
    """AdamOptimizer for each trained weight, with ORT's per-weight moments and update counts."""

    def step(self, learning_rate: float, grad_norm: Tensor | None = None) -> None:
        """One update from the accumulated gradients; ``grad_norm`` (their global L2 norm) is
        required when gradient clipping is on."""
        norm = self._clip_norm(grad_norm)
        groups: dict[tuple[AdamAttributes, int], list[str]] = {}
        for name in self.params:
            groups.setdefault((self.attributes[name], self.update_counts[name]), []).append(name)
        for (attributes, count), names in groups.items():
            params: list[Tensor] = [self.params[n] for n in names]
            stored = [self.moments[n][0] for n in names], [self.moments[n][1] for n in names]
            moments = (
                stored
                if stored[0][0].dtype == torch.float32
                else ([m.float() for m in stored[0]], [v.float() for v in stored[1]])
            )
            adam_update(
                params,
                gradient_buffers(params),
                *moments,
                learning_rate=learning_rate,
                update_count=count,
                attributes=attributes,
                grad_norm=norm,
            )
            if moments is not stored:  # fp16 moments: float32 math, float16 storage
                torch._foreach_copy_(stored[0] + stored[1], moments[0] + moments[1])
            for name in names:
                self.update_counts[name] = count + 1


def _sgd(arguments: LegacyArguments) -> LegacyOptimizer:
    return SGD(arguments.params)


def _adam(arguments: LegacyArguments) -> LegacyOptimizer:
    a = arguments
    attributes = {
        weight: adam_attributes(weight, a.float_attributes[weight], a.int_attributes[weight]) for weight in a.params
    }
    return Adam(a.params, attributes, a.initial_state, a.clip_grad_norm, a.fp16_moments)


def _lamb(arguments: LegacyArguments) -> LegacyOptimizer:
    a = arguments
    attributes = {
        weight: lamb_attributes(weight, a.float_attributes[weight], a.int_attributes[weight]) for weight in a.params
    }
    return Lamb(a.params, attributes, a.initial_state, a.clip_grad_norm, a.fp16_moments)


# training_optimizer_name -> its record
LEGACY_OPTIMIZERS = {
    "SGDOptimizer": LegacyAlgorithm({}, {}, _sgd),
    "AdamOptimizer": LegacyAlgorithm(ADAM_FLOAT_DEFAULTS, ADAM_INT_DEFAULTS, _adam),
    "LambOptimizer": LegacyAlgorithm(LAMB_FLOAT_DEFAULTS, LAMB_INT_DEFAULTS, _lamb),
}


def bias_correction(coefficient: float, update_count: int, enabled: bool) -> float:
    """``1 - coefficient^t`` as ORT computes it (in double, then rounded to float32); 1 when disabled."""
    if not enabled or update_count <= 0:
        return 1.0
    return to_float32(1.0 - coefficient**update_count)


@torch.no_grad()
def adam_update(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    *,
    learning_rate: float,
    update_count: int,
    attributes: AdamAttributes,
    grad_norm: Tensor | None,
) -> None:
    """One legacy AdamOptimizer update in place (``grads`` are scaled in place when clipping)."""
    a = attributes
    lr = to_float32(learning_rate)
    params, grads, m1, m2 = list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)
    if grad_norm is not None:
        torch._foreach_div_(grads, clip_divisor(grad_norm, a.max_norm_clip))
    torch._foreach_mul_(m1, a.alpha)
    torch._foreach_add_(m1, torch._foreach_mul(grads, to_float32(1.0 - a.alpha)))
    squared = torch._foreach_mul(grads, to_float32(1.0 - a.beta))
    torch._foreach_mul_(squared, grads)
    torch._foreach_mul_(m2, a.beta)
    torch._foreach_add_(m2, squared)
    bc1 = bias_correction(a.alpha, update_count, a.do_bias_correction)
    bc2 = bias_correction(a.beta, update_count, a.do_bias_correction)
    if a.weight_decay_mode == 0:
        denom = torch._foreach_div(m2, bc2)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, a.epsilon)
        update = torch._foreach_div(m1, bc1)
        torch._foreach_div_(update, denom)
        if a.lambda_ != 0.0:
            torch._foreach_add_(update, torch._foreach_mul(params, a.lambda_))
        torch._foreach_mul_(update, -lr)
        torch._foreach_add_(params, update)
        return
    denom = torch._foreach_sqrt(m2)
    torch._foreach_add_(denom, a.epsilon)
    step_size = to_float32(to_float32(lr * to_float32(math.sqrt(bc2))) / bc1)
    update = torch._foreach_mul(m1, step_size)
    torch._foreach_div_(update, denom)
    if a.lambda_ != 0.0:
        decay = torch._foreach_sub(params, update)
        torch._foreach_mul_(decay, to_float32(lr * a.lambda_))
        torch._foreach_add_(update, decay)
    torch._foreach_sub_(params, update)
