"""Mixed precision: the forward under ``torch.autocast`` and, for fp16, GradScaler's loss scaling.

Parameters and optimizer moments stay float32 (master weights); only the forward's ops run in the
low precision. ``LossScaler`` keeps ``torch.amp.GradScaler``'s semantics and runs its kernels
(``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``): the loss is multiplied by
the scale before backward, the optimizer unscales the gradients and skips a step whose gradients
hold inf or nan, after which the scale is multiplied by ``backoff_factor``; after ``growth_interval``
clean steps in a row by ``growth_factor``. A static scaler (``dynamic=False``) never changes its scale.
In a data-parallel run (``process_group`` set) the inf/nan flag is all-reduced (max) before the
decision, as torch's sharded GradScaler does: a step is skipped on every rank or on none.
The scale and the clean-step count live in the checkpoint's properties (``LOSS_SCALE_PROPERTY``,
``GROWTH_TRACKER_PROPERTY``), written at every optimizer step and read when a Module is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ort_torch_train.checkpoint.state import TrainingState

LOSS_SCALE_PROPERTY = "mixed_precision.loss_scale"
GROWTH_TRACKER_PROPERTY = "mixed_precision.growth_tracker"
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class MixedPrecision:
    """Autocast of one low-precision dtype, plus a LossScaler for fp16 (None for bf16).

    ``loss_scale`` (fp16 only) is ORT's legacy setting: 0 a dynamic scale, > 0 that static scale.
    ``process_group``: the data-parallel group whose ranks must agree on skipping a step (None: one process).
    """

    def __init__(
        self, setting: str, state: TrainingState, *, loss_scale: float = 0.0, process_group: Any = None
    ) -> None:
        check_mixed_precision(setting)
        self.setting = setting
        self.dtype = _DTYPES[setting]
        self.loss_scaler: LossScaler | None = None
        if setting == "fp16":
            self.loss_scaler = (
                LossScaler(state, process_group=process_group)
                if loss_scale == 0
                else LossScaler(state, init_scale=loss_scale, dynamic=False, process_group=process_group)
            )

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The autocast context for a forward on ``device``."""
        return torch.autocast(device.type, dtype=self.dtype)


def check_mixed_precision(setting: str | None) -> None:
    """Raise unless ``setting`` is a ``mixed_precision`` value: "bf16", "fp16" or None."""
    if setting is not None and setting not in _DTYPES:
        raise ValueError(f"mixed_precision: expected 'bf16', 'fp16' or None; got {setting!r}")


def autocast_or_null(precision: MixedPrecision | None, device: torch.device) -> contextlib.AbstractContextManager:
    """``precision``'s autocast context, or a no-op one without mixed precision."""
    return contextlib.nullcontext() if precision is None else precision.autocast(device)


def float32_outputs(outputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """Autocast's half-precision outputs as float32 (what the ONNX graph declares), others unchanged."""
    return tuple(t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in outputs)


class LossScaler:
    """GradScaler semantics over a TrainingState's properties (see the module docstring)."""

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
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.dynamic = dynamic
        scale = float(state.properties.get(LOSS_SCALE_PROPERTY, init_scale)) if dynamic else float(init_scale)
        tracker = int(state.properties.get(GROWTH_TRACKER_PROPERTY, 0)) if dynamic else 0
        self.scale = torch.full((), scale, dtype=torch.float32)
        self._growth_tracker = torch.full((), tracker, dtype=torch.int32)
        self._found_inf = torch.zeros((), dtype=torch.float32)
        self.process_group = process_group  # the data-parallel group whose ranks must agree on skipping a step
        self._write_properties()

    def scaled(self, loss: Tensor) -> Tensor:
        """``loss * scale`` (in float32), the tensor to run backward from."""
        return loss.float() * self.scale.to(loss.device, non_blocking=True)

    def unscale_and_update(self, grads: list[Tensor]) -> bool:
        """Divide ``grads`` by the scale in place and update the scale; return whether all were finite."""
        device = grads[0].device
        self._move(device)
        self._found_inf.zero_()
        inverse = self.scale.double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self._found_inf, inverse)
        if self.process_group is not None:
            dist.all_reduce(self._found_inf, op=dist.ReduceOp.MAX, group=self.process_group)
        found_inf = bool(self._found_inf.item())
        if self.dynamic:
            torch._amp_update_scale_(
                self.scale,
                self._growth_tracker,
                self._found_inf,
                self.growth_factor,
                self.backoff_factor,
                self.growth_interval,
            )
        self._write_properties()
        return not found_inf

    @property
    def found_inf(self) -> Tensor:
        """The last check's flag (1.0 when a gradient held inf or nan); reduce it across ranks to agree."""
        return self._found_inf

    def get_scale(self) -> float:
        """The current loss scale."""
        return float(self.scale.item())

    def _move(self, device: torch.device) -> None:
        if self.scale.device != device:
            self.scale = self.scale.to(device)
            self._growth_tracker = self._growth_tracker.to(device)
            self._found_inf = self._found_inf.to(device)

    def _write_properties(self) -> None:
        if self.dynamic:
            self.state.properties[LOSS_SCALE_PROPERTY] = float(self.scale.item())
            self.state.properties[GROWTH_TRACKER_PROPERTY] = int(self._growth_tracker.item())


def backward(loss: Tensor, precision: MixedPrecision | None) -> None:
    """Backward from the loss (ORT's ones seed for a non-scalar one), scaled when fp16 scaling is on."""
    scaler = None if precision is None else precision.loss_scaler
    if scaler is not None:
        loss = scaler.scaled(loss)
    loss.backward(None if loss.dim() == 0 else torch.ones_like(loss))
