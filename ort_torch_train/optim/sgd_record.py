"""The record of ORT's ``com.microsoft.SGDOptimizerV2`` (``optim/algorithm.py``): its graph layout and
hyperparameters, without torch; its kernels (``sgd.py``) are imported when they first run."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from ort_torch_train.optim.algorithm import (
    DEFAULT_LEARNING_RATE,
    AttributeValue,
    Hyperparameters,
    OptimizerAlgorithm,
    lazy_kernel,
)

IMPLEMENTATIONS = ("foreach", "single", "compiled")
_KERNELS = "ort_torch_train.optim.sgd"


@dataclass(frozen=True)
class SGDHyperparameters:
    """The learning rate: SGDOptimizerV2 has no attribute."""

    lr: float

    def with_learning_rate(self, lr: float) -> SGDHyperparameters:
        """These hyperparameters with another learning rate."""
        return dataclasses.replace(self, lr=lr)


def _hyperparameters(attributes: Mapping[str, AttributeValue]) -> SGDHyperparameters:
    return SGDHyperparameters(DEFAULT_LEARNING_RATE)


def _reported(hyperparameters: Hyperparameters) -> dict[str, float | int | bool]:
    return {}  # no attribute


SGD_ALGORITHM = OptimizerAlgorithm(
    op_type="SGDOptimizerV2",
    display_name="SGD",
    name="sgd",
    graph_inputs=("learning_rate", "step", "params", "gradients", "first_order_moments"),
    node_inputs=("learning_rate", "params", "gradients"),
    attribute_defaults={},
    make_hyperparameters=_hyperparameters,
    reported=_reported,
    # ORT's checkpoint holds a zero momentum0 per parameter that SGDOptimizerV2 never reads
    stored_moments=("momentum0",),
    updated_moments=(),
    implementations=IMPLEMENTATIONS,
    default_implementation=lazy_kernel(_KERNELS, "kernel_default_implementation"),
    update=lazy_kernel(_KERNELS, "kernel_update"),
    scratch_lists=1,
    fused_update=lazy_kernel(_KERNELS, "kernel_fused_update"),
    step_scalars=lazy_kernel(_KERNELS, "kernel_step_scalars"),
    elementwise=True,
)
