"""A training state's parts read from a checkpoint record, and the record written from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import torch

from ort_torch_train.checkpoint.records import CheckpointRecord, OptimizerGroupRecord
from ort_torch_train.errors import CheckpointError
from ort_torch_train.state.optimizer_state import OptimizerState
from ort_torch_train.state.values import new_parameter

Moments = Mapping[str, Mapping[str, torch.Tensor]]  # parameter name -> moment name -> tensor


class StateParts(TypedDict):
    """The keyword arguments of ``TrainingState`` that a record gives."""

    is_nominal: bool
    optimizer: OptimizerState | None
    properties: dict[str, int | float | str]
    has_external_data: bool


def parts_of_record(record: CheckpointRecord) -> tuple[dict[str, torch.nn.Parameter], StateParts]:
    """The record's parameters (adopting its tensors, no copy) and the state's other parts. At most one
    optimizer group."""
    both = sorted(set(record.trainable) & set(record.frozen))
    if both:
        raise CheckpointError(f"parameters {both} are listed as both trainable and frozen")
    params = {name: new_parameter(name, tensor, True) for name, tensor in record.trainable.items()}
    params.update((name, new_parameter(name, tensor, False)) for name, tensor in record.frozen.items())
    groups = record.optimizer_groups
    if len(groups) > 1:
        raise CheckpointError(
            f"the checkpoint holds {len(groups)} optimizer groups "
            f"{[group.name for group in groups]}; only one group is supported (as in ORT)"
        )
    optimizer = None
    if groups:
        group = groups[0]
        optimizer = OptimizerState(group.name, group.step, group.initial_learning_rate, group.momentums)
    parts: StateParts = {
        "is_nominal": record.is_nominal,
        "optimizer": optimizer,
        "properties": record.properties,
        "has_external_data": record.has_external_data,
    }
    return params, parts


def record_of(
    params: Mapping[str, torch.nn.Parameter],
    values: Mapping[str, torch.Tensor],
    parts: StateParts,
    moments: Moments | None,
) -> CheckpointRecord:
    """The record of a state whose parameters hold ``values`` (the live tensors, or whole values gathered
    from shards), with the optimizer group holding ``moments`` when they are given."""
    groups = []
    optimizer = parts["optimizer"]
    if optimizer is not None and moments is not None:
        groups.append(
            OptimizerGroupRecord(
                optimizer.group_name,
                optimizer.step,
                optimizer.initial_learning_rate,
                {param: dict(moment) for param, moment in moments.items()},
            )
        )
    return CheckpointRecord(
        trainable={n: values[n] for n, p in params.items() if p.requires_grad},
        frozen={n: values[n] for n, p in params.items() if not p.requires_grad},
        is_nominal=parts["is_nominal"],
        optimizer_groups=groups,
        properties=dict(parts["properties"]),
        has_external_data=parts["has_external_data"],
    )
