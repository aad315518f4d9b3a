"""Loss scaling for fp16 mixed precision: a ``torch.amp.GradScaler`` whose state lives in a TrainingState.

The loss is multiplied by the scale before backward; ``unscale_and_update`` divides the gradients by it
in place, reports whether they were all finite (a step whose gradients hold inf or nan is skipped) and
updates the scale: multiplied by ``backoff_factor`` after a skipped step, by ``growth_factor`` after
``growth_interval`` clean steps in a row. A static scaler (``dynamic=False``) sets its scale back after
every step (``GradScaler.update(new_scale)``). With a ``process_group`` the scaler is torch's
``ShardedGradScaler``, which all-reduces the inf/nan flag before the decision: a step is skipped on
every rank or on none. ORT's on-device training API has no loss scaling of its own, so GradScaler's
semantics are the reference. The scale and the clean-step count live in the checkpoint's properties
(``LOSS_SCALE_PROPERTY``, ``GROWTH_TRACKER_PROPERTY``), written at every optimizer step and read when
the scaler is made.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.torch_internals import sharded_grad_scaler

LOSS_SCALE_PROPERTY = "mixed_precision.loss_scale"
GROWTH_TRACKER_PROPERTY = "mixed_precision.growth_tracker"


class LossScaler:
    """A ``torch.amp.GradScaler`` whose state lives in a TrainingState's properties (see the module docstring)."""

    def __init__(
        self,
        state: TrainingState,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        dynamic: bool = True,
        process_group: Any = None,
    ) -> None:
        if not init_scale > 0:
            raise ValueError(f"loss scale: expected a positive number, got {init_scale!r}")
        self.state = state
        self.dynamic = dynamic
        self._static_scale = float(init_scale)
        settings: dict[str, Any] = {
            "device": state.device.type,
            "init_scale": init_scale,
            "growth_factor": growth_factor,
            "backoff_factor": backoff_factor,
            "growth_interval": growth_interval,
        }
        self._scaler = (
            torch.amp.GradScaler(**settings)
            if process_group is None
            else sharded_grad_scaler(**settings, process_group=process_group)
        )
        if dynamic and LOSS_SCALE_PROPERTY in state.properties:
            self._scaler.load_state_dict(
                {
                    **self._scaler.state_dict(),
                    "scale": float(state.properties[LOSS_SCALE_PROPERTY]),
                    "_growth_tracker": int(state.properties.get(GROWTH_TRACKER_PROPERTY, 0)),
                }
            )
        self._ones: dict[torch.device, Tensor] = {}
        self._write_properties()

    @property
    def growth_interval(self) -> int:
        """Clean steps in a row after which the scale grows."""
        return self._scaler.get_growth_interval()

    @growth_interval.setter
    def growth_interval(self, steps: int) -> None:
        self._scaler.set_growth_interval(steps)

    @property
    def scale(self) -> Tensor:
        """The current scale as a float32 scalar tensor (for a compiled step to multiply its loss by)."""
        device = self.state.device
        if device not in self._ones:
            self._ones[device] = torch.ones((), dtype=torch.float32, device=device)
        return self._scaler.scale(self._ones[device])

    def scaled(self, loss: Tensor) -> Tensor:
        """``loss * scale`` (in float32), the tensor to run backward from."""
        return self._scaler.scale(loss.float())

    def unscale_and_update(self, grads: list[Tensor]) -> bool:
        """Divide ``grads`` by the scale in place and update the scale; return whether all were finite."""
        gradients = cast(torch.optim.Optimizer, _GradientBuffers(grads))  # read as GradScaler reads an optimizer
        self._scaler.unscale_(gradients)
        finite = self._scaler.step(gradients) is not None
        self._scaler.update(None if self.dynamic else self._static_scale)
        self._write_properties()
        return finite

    def get_scale(self) -> float:
        """The current loss scale."""
        return self._scaler.get_scale()

    def _write_properties(self) -> None:
        if self.dynamic:
            saved = self._scaler.state_dict()
            self.state.properties[LOSS_SCALE_PROPERTY] = float(saved["scale"])
            self.state.properties[GROWTH_TRACKER_PROPERTY] = int(saved["_growth_tracker"])


class _GradientBuffers:
    """Gradient buffers presented as GradScaler reads an optimizer: one param group of tensors whose
    ``.grad`` they are (detached aliases, no copies). The buffers belong to no torch optimizer here
    (ORT's optimizer model runs as this project's own kernels), and ``step`` is what ``GradScaler.step``
    calls when the gradients are finite: it only reports that."""

    def __init__(self, grads: list[Tensor]) -> None:
        aliases = []
        for grad in grads:
            alias = grad.detach()
            alias.grad = grad
            aliases.append(alias)
        self.param_groups = [{"params": aliases}]

    def step(self) -> bool:
        """Called by GradScaler.step when every gradient is finite."""
        return True
