"""Plain records of what an ORT training checkpoint file holds (see ``odtc`` for the format)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class OptimizerGroupRecord:
    """One optimizer group: its name, step count, initial learning rate and per-parameter moments."""

    name: str
    step: int
    initial_learning_rate: float
    # param name -> {"momentum0": tensor, "momentum1": tensor}, in file order
    momentums: dict[str, dict[str, torch.Tensor]]


@dataclass
class CheckpointRecord:
    """Everything an ORT checkpoint file holds, as CPU torch tensors owned by the record."""

    trainable: dict[str, torch.Tensor]  # requires_grad_params, file order
    frozen: dict[str, torch.Tensor]  # frozen_params, file order
    is_nominal: bool = False  # nominal tensors: torch.empty(0, dtype=<their dtype>)
    optimizer_groups: list[OptimizerGroupRecord] = field(default_factory=list)
    properties: dict[str, int | float | str] = field(default_factory=dict)  # int64 / float32 / str
    # Parameter data lives in the side file "<checkpoint>.data"; write_checkpoint keeps it there, as
    # ORT's save does for a state loaded from such a checkpoint.
    has_external_data: bool = False
