"""Mixed precision: the forward under ``torch.autocast`` and, for fp16, loss scaling (``state/loss_scale.py``).

Parameters and optimizer moments stay float32 (master weights); only the forward's ops run in the
low precision. A compiled step multiplies the loss by the scale inside its graph (``LossScaler.scale``
is passed in as a tensor); unscaling, the skip decision and the scale update stay outside it, since
``GradScaler.step`` decides on the host (one synchronisation per step).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ort_torch_train.state.loss_scale import LossScaler
from ort_torch_train.state.training_state import TrainingState

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


def backward(loss: Tensor, precision: MixedPrecision | None) -> None:
    """Backward from the loss (ORT's ones seed for a non-scalar one), scaled when fp16 scaling is on."""
    scaler = None if precision is None else precision.loss_scaler
    if scaler is not None:
        loss = scaler.scaled(loss)
    loss.backward(None if loss.dim() == 0 else torch.ones_like(loss))
