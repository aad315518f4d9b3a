"""Learning-rate schedules as pure functions of the optimizer's completed-step count.

Each ``*_with_warmup`` function returns the multiplicative factor applied to the initial learning
rate. ORT's ``MultiplicativeLRSchedulerBase`` (training_api/lr_scheduler.h) computes
``lr = initial_lr * factor`` in float32: see ``scheduled_learning_rate``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ort_torch_train.optim.float32 import to_float32

FLOAT32_MAX = float(np.finfo(np.float32).max)


def linear_with_warmup(step: int, warmup: int, total: int) -> float:
    """ORT's LinearLRScheduler factor (training_api/lr_scheduler.cc).

    ``step / max(1, warmup)`` while ``step < warmup``, then ``max(0, (total - step) / max(1, total - warmup))``.
    """
    _check_schedule(step, warmup, total)
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def cosine_with_warmup(step: int, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """Linear warmup to 1, then half a cosine from 1 down to ``min_ratio`` at ``total`` (and after)."""
    _check_schedule(step, warmup, total)
    if not (isinstance(min_ratio, numbers.Real) and 0.0 <= min_ratio <= 1.0):
        raise ValueError(f"min_ratio must be a number in [0, 1]; got {min_ratio!r}")
    if step < warmup:
        return step / max(1, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def constant_with_warmup(step: int, warmup: int) -> float:
    """Linear warmup to 1 over ``warmup`` steps, then 1."""
    _check_count("step", step)
    _check_count("warmup", warmup)
    return step / max(1, warmup) if step < warmup else 1.0


def scheduled_learning_rate(initial_lr: float, factor: float) -> float:
    """``initial_lr * factor`` with both operands and the product in float32, as ORT computes it."""
    return to_float32(to_float32(initial_lr) * to_float32(factor))


def check_learning_rate(value: float, name: str = "learning rate") -> float:
    """Return ``value`` as a float if it is a finite, non-negative number representable in float32."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be finite and >= 0; got {value!r}")
    if value > FLOAT32_MAX:
        raise ValueError(f"{name} must fit in float32 (<= {FLOAT32_MAX:.7g}); got {value!r}")
    return value


def check_schedule_counts(warmup: int, total: int) -> None:
    """Raise ValueError unless ``0 <= warmup <= total`` are ints."""
    _check_count("warmup step count", warmup)
    _check_count("total step count", total)
    if warmup > total:
        raise ValueError(f"warmup step count ({warmup}) must not exceed total step count ({total})")


def check_schedule_not_over(scheduler: str, completed_steps: int, total: int) -> None:
    """Raise ValueError when the optimizer has already completed ``total`` steps or more: the schedule
    would train at learning rate 0 from its first step (typically a resumed run given the remaining
    steps as its total instead of the whole run's)."""
    if completed_steps >= total:
        raise ValueError(
            f"{scheduler}: total_step_count ({total}) is not above the optimizer's completed steps "
            f"({completed_steps}, restored from the checkpoint or taken so far), so every step would train at "
            f"learning rate 0. Count total_step_count over the whole run, e.g. {completed_steps} + the steps "
            "still to train (CheckpointState.step is the count so far)."
        )


def _check_schedule(step: int, warmup: int, total: int) -> None:
    _check_count("step", step)
    check_schedule_counts(warmup, total)


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0; got {value}")
