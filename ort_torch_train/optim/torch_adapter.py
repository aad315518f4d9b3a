"""A ``torch.optim.Optimizer`` view of an OptimizerEngine, so that torch's LR schedulers can drive it."""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

import torch

from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.tensor_lists import gradient_buffers


class TorchOptimizerAdapter(torch.optim.Optimizer):
    """One param group over the engine's trainable parameters; ``step()`` runs the engine.

    ``param_groups[0]["lr"]`` is the learning rate: it is applied at every ``step()``, so any
    ``torch.optim.lr_scheduler`` may set it. The moments stay in the TrainingState (checkpoint them
    with the CheckpointState, not with ``state_dict()``).
    """

    def __init__(self, engine: OptimizerEngine) -> None:
        self.engine = engine
        super().__init__(engine.parameters, {"lr": engine.learning_rate})

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Apply ``param_groups[0]["lr"]``, then run one optimizer step; return the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.pull_learning_rate()
        self.engine.step()
        return loss

    def pull_learning_rate(self) -> None:
        """Copy ``param_groups[0]["lr"]`` into the engine (validated, rounded to float32)."""
        self.engine.set_learning_rate(float(self.param_groups[0]["lr"]))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradient buffers in place (they are kept: ORT's gradients are never None)."""
        torch._foreach_zero_(gradient_buffers(self.engine.parameters))
