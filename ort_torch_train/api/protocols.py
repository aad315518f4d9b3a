"""What the faces read of each other: the Optimizer of its Module, and ``Module.step`` of its optimizer.

``Module`` and ``Optimizer`` satisfy these; anything else that does may stand in for them (a test's
stand-in module, say). ``trainer.protocols`` adds what ``fit`` calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import onnx

from ort_torch_train.distributed.data_parallel import DataParallel
from ort_torch_train.optim.engine import OptimizerEngine, UpdateProgram
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.precision import MixedPrecision

if TYPE_CHECKING:  # pipelining loads Dynamo's shape machinery: imported where used
    from ort_torch_train.distributed.pipeline import PipelineParallel


class TrainableModule(Protocol):
    """What an ``Optimizer`` reads of the module whose trainable parameters it updates."""

    @property
    def training_state(self) -> TrainingState:
        """The state holding the parameters, their gradients and the optimizer's moments."""
        ...

    @property
    def trainable_parameter_names(self) -> list[str]:
        """The trained parameters' names, in the training graph's order."""
        ...

    @property
    def data_parallel(self) -> DataParallel | None:
        """What averages the gradients across ranks, or None (one process)."""
        ...

    @property
    def pipeline(self) -> PipelineParallel | None:
        """The pipeline the train steps run as, one stage per rank, or None."""
        ...

    @property
    def precision(self) -> MixedPrecision | None:
        """Autocast and loss scaling, or None (float32 throughout)."""
        ...

    def update_program(self, optimizer_model: onnx.ModelProto) -> UpdateProgram | None:
        """The optimizer program of the module's programs compiled ahead of time (``compile="package:DIR"``, where
        the package was built from ``optimizer_model``; ``compile="aot"``), bound to its state; else None."""
        ...


class StepOptimizer(Protocol):
    """What ``Module.step`` reads of the optimizer whose update it runs in its train step."""

    def engine_for_step(self) -> OptimizerEngine:
        """The optimizer core, the current learning rate applied."""
        ...
