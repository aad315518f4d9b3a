"""How a TrainingState shared by several processes is saved and read: the coordinators a distributed
strategy gives it (``TrainingState.coordinate_saves``, ``coordinate_reads``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ort_torch_train.state.training_state import TrainingState


class SaveCoordinator(Protocol):
    """Writes a state's checkpoint when several processes share it (e.g. once, from rank 0 of a
    data-parallel run); every process calls ``save``."""

    def save(self, state: TrainingState, path: str | os.PathLike, include_optimizer_state: bool) -> None:
        """Write ``state`` to ``path`` (``include_optimizer_state`` as in ``TrainingState.save``)."""
        ...


class ParameterSource(Protocol):
    """Gives a state's whole parameter values when its process holds only part of them (a pipeline stage)."""

    def whole(self, name: str) -> torch.Tensor:
        """Parameter ``name``'s whole value (a collective where other processes hold it)."""
        ...
