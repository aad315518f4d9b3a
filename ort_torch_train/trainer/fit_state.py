"""What a ``fit`` run shows: ``FitState`` (where the loop stands, for callbacks), the ``Callback`` hooks,
``FitResult`` (what the run did) and ``TrainingDiverged``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ort_torch_train.api import CheckpointState, Properties
from ort_torch_train.trainer.data import DataPosition, store_data_position
from ort_torch_train.trainer.loader_state import StatefulLoader, store_loader_state
from ort_torch_train.trainer.metric_base import Metric
from ort_torch_train.trainer.protocols import FitModule, FitOptimizer


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class FitState:
    """What callbacks see of the run: the module and optimizer, where the loop stands, the last numbers.

    Args:
        module: the module being trained.
        optimizer: its optimizer.
        start_step: the step count at the start.
        step: the step count now.
        epoch: the data's epoch.
        position: batches consumed in this epoch.
        seed: the data order's seed (a ResumableBatchSampler's).
        loss: the last step's loss.
        learning_rate: the learning rate of the next step.
        steps_per_second: the rate so far, after the first step.
        first_step_seconds: the first step's time.
        metrics: the last evaluation's metrics.
        monitored: the evaluated metrics, by name.
        target_step: the step the run ends at, when known.
        should_stop: set by ``stop``: end after this step.
        stop_reason: why the run stops early.
        interrupted: whether Ctrl-C ended the run.
        loader: a stateful data loader whose state the checkpoints keep.
        loader_restored: whether that loader continues from a checkpoint's state.
    """

    module: FitModule
    optimizer: FitOptimizer
    start_step: int
    step: int
    epoch: int = 0
    position: int = 0  # batches consumed in this epoch
    seed: int | None = None  # the data order's seed, when the data is a ResumableBatchSampler's
    loss: float = math.nan
    learning_rate: float = math.nan
    steps_per_second: float = math.nan
    first_step_seconds: float | None = None  # the first step's time (compilation, with ``compile``)
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation's
    monitored: dict[str, Metric] = field(default_factory=dict)  # the evaluated metrics, by name
    target_step: int | None = None  # the step the run ends at, when known
    should_stop: bool = False  # a callback ends the run after this step
    stop_reason: str | None = None
    interrupted: bool = False  # Ctrl-C (SIGINT) ended the run
    loader: StatefulLoader | None = None  # a data loader whose state the checkpoints keep
    loader_restored: bool = False  # it continues from the checkpoint's state (no batches to replay)

    @property
    def properties(self) -> Properties:
        """The checkpoint's properties (saved with every checkpoint)."""
        return Properties(self.module.training_state)

    def save(self, path: str | Path) -> None:
        """Save the checkpoint with its optimizer state and this data position (``--resume`` continues it)."""
        store_data_position(self.properties, DataPosition(self.epoch, self.position, self.seed))
        if self.loader is not None:
            store_loader_state(self.properties, self.loader)
        CheckpointState.save_checkpoint(CheckpointState(self.module.training_state), path, include_optimizer_state=True)

    def stop(self, reason: str) -> None:
        """End the run after this step."""
        self.should_stop = True
        self.stop_reason = reason


class Callback:
    """Hooks of ``fit``; override the ones you need. ``on_train_end`` runs after a finished, stopped or
    interrupted run (not after an error); ``close`` runs always."""

    def on_train_begin(self, run: FitState) -> None:
        """Before the first step."""

    def on_evaluate(self, run: FitState, metrics: dict[str, float]) -> None:
        """After an evaluation (before ``on_step_end`` of the same step)."""

    def on_step_end(self, run: FitState) -> None:
        """After each optimizer step."""

    def on_train_end(self, run: FitState) -> None:
        """After the last step."""

    def close(self) -> None:
        """Release files and connections."""


@dataclass
class FitResult:
    """What ``fit`` did: its steps, each step's loss, timings and the last evaluation.

    Args:
        start_step: the optimizer's step count at the start.
        last_step: its count at the end.
        losses: each step's loss.
        seconds: the time of the steps after the first.
        first_step_seconds: the first step's time (compilation with ``compile``).
        metrics: the last evaluation's metrics.
        interrupted: whether Ctrl-C ended the run.
        stop_reason: why a callback ended the run early (None: it ran to its end).
        wall_seconds: the time from the end of the first step to the end of the run, evaluations,
            callbacks and saves included (the progress bar's clock).
    """

    start_step: int
    last_step: int
    losses: list[float]
    seconds: float  # the steps after the first (evaluations and callbacks left out)
    first_step_seconds: float | None  # the first step (compilation, with ``compile``)
    metrics: dict[str, float]
    interrupted: bool
    stop_reason: str | None
    wall_seconds: float = 0.0  # after the first step, evaluations, callbacks and saves included

    @property
    def steps_per_second(self) -> float:
        """Steps per second after the first (NaN with fewer than two steps)."""
        steady = len(self.losses) - 1
        return steady / self.seconds if steady > 0 and self.seconds > 0 else math.nan

    @property
    def wall_steps_per_second(self) -> float:
        """Steps per second after the first, evaluations, callbacks and saves included: the progress bar's
        rate (NaN with fewer than two steps)."""
        steady = len(self.losses) - 1
        return steady / self.wall_seconds if steady > 0 and self.wall_seconds > 0 else math.nan
