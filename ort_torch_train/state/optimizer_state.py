"""The optimizer's part of a TrainingState: ORT's one optimizer group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import CheckpointError
from ort_torch_train.state.values import shape_text


@dataclass
class OptimizerState:
    """The one optimizer group ORT supports: step count, initial learning rate and moments."""

    group_name: str = "group0"
    step: int = 0
    initial_learning_rate: float = 0.001
    # param name -> {"momentum0": tensor, "momentum1": tensor}
    momentums: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def check_moments(self, params: Mapping[str, torch.Tensor], is_nominal: bool) -> None:
        """Raise CheckpointError for moments of no parameter, or (unless ``is_nominal``) shaped or typed
        unlike their parameter."""
        for name, moments in self.momentums.items():
            if name not in params:
                raise CheckpointError(
                    f"optimizer group {self.group_name!r} holds moments for {name!r}, which is not a parameter"
                )
            param = params[name]
            for moment_name, moment in moments.items():
                if not is_nominal and (moment.shape != param.shape or moment.dtype != param.dtype):
                    raise CheckpointError(
                        f"optimizer moment {moment_name!r} of {name!r} is "
                        f"{dtype_name(moment.dtype)}{shape_text(moment.shape)}, but the "
                        f"parameter is {dtype_name(param.dtype)}{shape_text(param.shape)}"
                    )
