"""Checkpoints of a data-parallel run: written once, by rank 0, while the other ranks wait."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from ort_torch_train.checkpoint.state import TrainingState
from ort_torch_train.distributed.zero import ShardedOptimizerEngine
from ort_torch_train.errors import DistributedError


class DistributedCheckpoint:
    """Saves a data-parallel run's checkpoint once: rank 0 writes (moments gathered from their shards
    first), the other ranks write nothing and wait at a barrier. A ``TrainingState``'s save coordinator."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._sharded: ShardedOptimizerEngine | None = None  # the engine holding the moments' shards, if any

    def gather_moments_from(self, sharded: ShardedOptimizerEngine) -> None:
        """Save the whole moments, gathered from ``sharded``'s shards, instead of the state's slices."""
        self._sharded = sharded

    def save(self, state: TrainingState, path: str | os.PathLike, include_optimizer_state: bool) -> None:
        """Write ``state`` to ``path`` from rank 0 (a collective: every rank calls it)."""
        gathered = None
        if include_optimizer_state and self._sharded is not None:
            gathered = self._sharded.gathered_momentums()
        failure: Exception | None = None
        if dist.get_rank(self.group) == 0:
            try:
                if gathered is None or state.optimizer is None:
                    state.save(path, include_optimizer_state)
                else:
                    shard, state.optimizer.momentums = state.optimizer.momentums, gathered
                    try:
                        state.save(path, include_optimizer_state)
                    finally:
                        state.optimizer.momentums = shard
            except Exception as error:  # raised after the barrier, so no rank waits forever
                failure = error
        flag = torch.tensor([0.0 if failure is None else 1.0], device=state.device)  # NCCL: a CUDA tensor
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if failure is not None:
            raise failure
        if flag.item():
            raise DistributedError(f"save_checkpoint: rank 0 failed to write {path}")
