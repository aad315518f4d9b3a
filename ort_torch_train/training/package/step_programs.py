"""What a TrainingEngine runs instead of its own steps where ``compile`` names programs compiled ahead of time:
``StepPrograms`` (a package's, ``packaged.py``; or built on demand into the compile cache, ``on_demand.py``), opened
from the ``ProgramsSource`` its options hold (``EngineOptions.programs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import onnx
from torch import Tensor

from ort_torch_train.optim.engine import UpdateProgram
from ort_torch_train.state.training_state import TrainingState

if TYPE_CHECKING:
    from ort_torch_train.training.forward_graph import ForwardGraph


class TrainProgram(Protocol):
    """A train step bound to a state: ``step(inputs, reset)`` replaces (``reset``) or adds to the gradients, updates
    the frozen parameters a forward changes, in place, and returns the outputs."""

    def __call__(self, inputs: list[Tensor], reset: bool) -> tuple[Tensor, ...]: ...


class StepPrograms(Protocol):
    """The train, eval and optimizer programs of one engine's models and parameters."""

    @property
    def trainable_names(self) -> list[str]:
        """The trainable parameters' names, in the order the steps take them."""
        ...

    @property
    def frozen_names(self) -> list[str]:
        """The frozen parameters' names, in the order the train step takes them."""
        ...

    def bind_train(self, state: TrainingState) -> TrainProgram:
        """The train step over ``state``'s parameters and gradients."""
        ...

    def bind_update(self, state: TrainingState, optimizer_model: onnx.ModelProto) -> UpdateProgram | None:
        """The optimizer step of ``optimizer_model`` over ``state``'s trainable parameters, gradients and moments;
        None where these programs hold none for that model (the optimizer then runs its own kernel)."""
        ...

    def eval_step(self, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The eval graph's outputs for ``inputs`` and the eval graph's parameters ``params``."""
        ...


class ProgramsSource(Protocol):
    """Where an engine's step programs come from: ``open`` gives those of the models, graphs and parameters given
    (``trainable``: the trainable parameters' names in the training graph's order)."""

    def open(
        self,
        training_model: onnx.ModelProto,
        eval_model: onnx.ModelProto | None,
        graphs: tuple[ForwardGraph, ForwardGraph | None],
        state: TrainingState,
        trainable: list[str],
    ) -> StepPrograms: ...
