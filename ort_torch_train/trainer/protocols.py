"""What ``fit`` and ``evaluate`` call on the module, the optimizer and the scheduler they are given.

``ort_torch_train.api``'s ``Module``, ``Optimizer`` and LR schedulers satisfy these (as do torch's LR
schedulers for ``Scheduler``); ``api.protocols`` holds what the Module and the Optimizer read of each other.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch

from ort_torch_train.api.protocols import StepOptimizer
from ort_torch_train.distributed.data_parallel import DataParallel
from ort_torch_train.state.training_state import TrainingState


class EvalModule(Protocol):
    """What ``evaluate`` calls: the module in eval mode, called on a batch, then back in its former mode."""

    training: bool

    def eval(self) -> object:
        """Switch to the eval graph."""
        ...

    def train(self, mode: bool = True) -> object:
        """Switch to the training graph (``mode``) or the eval graph."""
        ...

    def __call__(self, *inputs: Any) -> Any:
        """The current mode's step on a batch of inputs (numpy arrays, tensors or OrtValues)."""
        ...


@runtime_checkable
class NamedInputs(Protocol):
    """A module that names its inputs (what ``evaluate`` needs for batches that are mappings by name)."""

    def input_names(self, training: bool | None = None) -> list[str]:
        """The training graph's (or eval graph's) user input names."""
        ...


class FitOptimizer(StepOptimizer, Protocol):
    """What ``fit`` calls on the optimizer, besides running it inside ``Module.step``."""

    def step(self) -> None:
        """Update the parameters from the accumulated gradients."""
        ...

    def get_learning_rate(self) -> float:
        """The learning rate the next step uses."""
        ...

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last step was skipped (fp16 gradients held inf or nan)."""
        ...


class FitModule(EvalModule, Protocol):
    """What ``fit`` calls on the module it trains."""

    @property
    def training_state(self) -> TrainingState:
        """The state the checkpoints save (its optimizer group counts the steps)."""
        ...

    @property
    def data_parallel(self) -> DataParallel | None:
        """What averages the gradients across ranks (holding the ranks' group), or None."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        ...

    def input_names(self, training: bool | None = None) -> list[str]:
        """The training graph's (or eval graph's) user input names."""
        ...

    def step(self, optimizer: FitOptimizer, *inputs: Any) -> Any:
        """Train step, optimizer step and gradient reset at once."""
        ...

    def no_sync(self) -> AbstractContextManager[None]:
        """Steps inside accumulate their gradients on this rank only."""
        ...

    def lazy_reset_grad(self) -> None:
        """Make the next train step overwrite the gradients."""
        ...


class Scheduler(Protocol):
    """What ``fit`` calls on the LR scheduler after each optimizer step."""

    def step(self) -> None:
        """Set the next step's learning rate."""
        ...
