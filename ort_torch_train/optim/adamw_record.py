"""The record of ORT's ``com.microsoft.AdamWOptimizer`` (``optim/algorithm.py``): its graph layout, attributes and
hyperparameters, without torch; its kernels (``adamw.py``) are imported when they first run."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ort_torch_train.errors import ModelError
from ort_torch_train.optim.algorithm import (
    DEFAULT_LEARNING_RATE,
    AttributeValue,
    Hyperparameters,
    OptimizerAlgorithm,
    lazy_kernel,
)
from ort_torch_train.optim.float32 import to_float32

IMPLEMENTATIONS = ("fused", "foreach", "single", "compiled")
_KERNELS = "ort_torch_train.optim.adamw"


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

    @functools.cached_property
    def step_constants(self) -> tuple[float, float, float]:
        """``(1 - beta1, 1 - beta2, lr * weight_decay)`` in float32: the step's scalars that no step count changes."""
        return (
            to_float32(1.0 - self.beta1),
            to_float32(1.0 - self.beta2),
            to_float32(self.lr * self.weight_decay),
        )

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


def own_hyperparameters(hyperparameters: Hyperparameters) -> AdamWHyperparameters:
    if not isinstance(hyperparameters, AdamWHyperparameters):
        raise TypeError(f"adamw: expected AdamWHyperparameters; got {type(hyperparameters).__name__}")
    return hyperparameters


def _reported(hyperparameters: Hyperparameters) -> dict[str, float | int | bool]:
    h = own_hyperparameters(hyperparameters)
    return {
        "beta1": h.beta1,
        "beta2": h.beta2,
        "epsilon": h.eps,
        "weight_decay": h.weight_decay,
        "adam_mode": h.adam_mode,
        "correct_bias": h.correct_bias,
    }


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
    default_implementation=lazy_kernel(_KERNELS, "kernel_default_implementation"),
    update=lazy_kernel(_KERNELS, "kernel_update"),
    scratch_lists=2,
    fused_update=lazy_kernel(_KERNELS, "kernel_fused_update"),
    step_scalars=lazy_kernel(_KERNELS, "kernel_step_scalars"),
    elementwise=True,
    host_step_scalars=lazy_kernel(_KERNELS, "kernel_host_step_scalars"),
)
