"""Checkpoints of a data-parallel run: written once, by rank 0, with no collective where none is needed.

Every rank holds the whole parameters and (unless ``shard_state``) the whole moments, so rank 0
writes alone and tells the others through the process group's store: each ``save_checkpoint`` of
rank 0 publishes its path and outcome under its sequence number. A rank other than 0 that calls
``save_checkpoint`` waits for rank 0's save of the same number; when rank 0 wrote that path it
returns (or raises rank 0's failure), and when rank 0 wrote another path (per-rank paths) it writes
its own. So ``if rank == 0: save_checkpoint(...)`` works, needing nothing from the other ranks.

Moments sharded across the ranks (``Optimizer(shard_state=True)``) must be gathered first, which
takes every rank: such a save is a collective, and rank 0 checks that the others arrived before
gathering (instead of crashing or hanging in mismatched collectives), raising with the recipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch.distributed as dist
from torch import Tensor

from ort_torch_train.errors import CheckpointError, DistributedError
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.state.training_state import TrainingState

ARRIVAL_TIMEOUT = 60.0  # seconds rank 0 waits for the other ranks at a save of sharded moments
_KEY = "ort_torch_train/save"


class MomentsGatherer(Protocol):
    """An optimizer engine's tensor provider that holds shards of the moments (ZeRO)."""

    def gathered_momentums(self, engine: OptimizerEngine) -> dict[str, dict[str, Tensor]]:
        """Every parameter's whole moments, gathered from every rank's shards (a collective)."""
        ...


class DistributedCheckpoint:
    """Saves a data-parallel run's checkpoint (see the module doc). A ``TrainingState``'s save coordinator."""

    def __init__(self, group: Any, arrival_timeout: float = ARRIVAL_TIMEOUT) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.arrival_timeout = arrival_timeout
        self._store = group.get_group_store()
        self._saves = 0  # save_checkpoint calls on this rank
        self._sharded_saves = 0  # those that gathered sharded moments
        # the engine whose moments are sharded, and its tensor provider that holds the shards, if any
        self._sharded: tuple[OptimizerEngine, MomentsGatherer] | None = None

    def gather_moments_from(self, engine: OptimizerEngine, shards: MomentsGatherer) -> None:
        """Save the whole moments, gathered from the shards of ``engine`` that ``shards`` (its tensor
        provider) holds, instead of the state's slices."""
        self._sharded = (engine, shards)

    def save(self, state: TrainingState, path: str | os.PathLike, include_optimizer_state: bool) -> None:
        """Write ``state`` to ``path`` from rank 0; on another rank, wait for that save (see the module doc)."""
        if state.lock.held_by_current_thread():
            raise DistributedError(
                f"save_checkpoint({os.fspath(path)!r}) was called inside a training step of this rank (from a "
                "signal handler?): a distributed save cannot wait for the step's end. Set a flag in the "
                "handler and save between steps (docs/scaling.md, Preemption)."
            )
        target = os.path.abspath(path)
        params, gathered = self.gathered(state, target, include_optimizer_state)
        self._saves += 1
        if self.rank == 0:
            self._write_and_publish(state, target, include_optimizer_state, gathered, params)
            return
        with self._failures(target, "waiting for rank 0's save"):
            published = json.loads(self._store.get(f"{_KEY}/{self._saves}"))
        if published["path"] != target:  # per-rank paths: each rank writes its own
            state.save(target, include_optimizer_state, moments=gathered, params=params)
        elif published["error"] is not None:
            raise DistributedError(f"save_checkpoint: rank 0 failed to write {target!r}: {published['error']}")

    def gathered(
        self, state: TrainingState, target: str, include_optimizer_state: bool, counted: bool = False
    ) -> tuple[dict[str, Tensor] | None, dict[str, dict[str, Tensor]] | None]:
        """What a save writes instead of the state's own tensors: whole parameters (None here: every rank
        holds them) and the moments gathered from the ranks' shards (None: not sharded or not saved). A
        collective where the moments are sharded; ``counted``: this rank has already met the others."""
        if not include_optimizer_state or self._sharded is None:
            return None, None
        if not counted:
            self._await_every_rank(target)
        with self._failures(target, "gathering the sharded moments"):
            engine, shards = self._sharded
            return None, shards.gathered_momentums(engine)

    def _write_and_publish(
        self,
        state: TrainingState,
        target: str,
        include_optimizer_state: bool,
        gathered: dict | None,
        params: dict[str, Tensor] | None,
    ) -> None:
        error: Exception | None = None
        try:
            state.save(target, include_optimizer_state, moments=gathered, params=params)
        except Exception as failure:  # published first, so that no rank waits for it in vain
            error = failure
        outcome = {"path": target, "error": None if error is None else f"{type(error).__name__}: {error}"}
        with self._failures(target, "publishing the save"):
            self._store.set(f"{_KEY}/{self._saves}", json.dumps(outcome))
        if error is not None:
            raise error

    def _await_every_rank(self, target: str) -> None:
        """Count this rank in at a sharded save; rank 0 waits (bounded) until every rank has come."""
        self._sharded_saves += 1
        key = f"{_KEY}/sharded/{self._sharded_saves}"
        with self._failures(target, "meeting the other ranks"):
            arrived = self._store.add(key, 1)
            deadline = time.monotonic() + self.arrival_timeout
            while self.rank == 0 and arrived < self.world_size:
                if time.monotonic() > deadline:
                    self._store.add(key, -1)  # not counted: the next sharded save starts this one afresh
                    self._sharded_saves -= 1
                    raise DistributedError(
                        f"save_checkpoint({target!r}) on rank 0: only {arrived} of {self.world_size} ranks "
                        f"called it within {self.arrival_timeout:g} s. With Optimizer(shard_state=True) (or Module(sharding=...)) "
                        "every rank holds a slice of the moments (and parameters), so every rank must call save_checkpoint (rank 0 "
                        "writes the file): call it on all ranks, not under `if rank == 0:`; or save without "
                        "the optimizer state (include_optimizer_state=False) from rank 0 alone."
                    )
                time.sleep(0.01)
                arrived = self._store.add(key, 0)

    @contextlib.contextmanager
    def _failures(self, target: str, action: str) -> Iterator[None]:
        """Turn a failed collective or store call (a rank died or timed out) into a DistributedError."""
        try:
            yield
        except (DistributedError, CheckpointError):
            raise
        except (RuntimeError, OSError) as error:  # DistStoreError is a RuntimeError
            raise DistributedError(
                f"save_checkpoint({target!r}) on rank {self.rank} of {self.world_size} failed while {action}: "
                f"another rank died or timed out during the save ({type(error).__name__}: {error})"
            ) from error
