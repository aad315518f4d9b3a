"""Deadlines of the suite's subprocesses, threads and waits, scaled by one factor for the machine's load.

A deadline only stops a hang; on a busy machine (other CPU-bound work on a small CPU) every wait grows,
so each one is written for an idle machine and multiplied by ``timeout_scale()``: the environment
variable ``ORT_TORCH_TRAIN_TEST_TIMEOUT_SCALE`` (a number > 0), else ``DEFAULT_SCALE``, enough for a
2-core machine kept busy by other processes. Processes the suite starts read the same variable.
"""

from __future__ import annotations

import os
import select
from typing import IO

TIMEOUT_SCALE_VARIABLE = "ORT_TORCH_TRAIN_TEST_TIMEOUT_SCALE"
DEFAULT_SCALE = 4.0


def timeout_scale() -> float:
    """``ORT_TORCH_TRAIN_TEST_TIMEOUT_SCALE`` when set, else ``DEFAULT_SCALE``; a ValueError naming the
    variable when it is not a number > 0."""
    text = os.environ.get(TIMEOUT_SCALE_VARIABLE, "")
    if not text:
        return DEFAULT_SCALE
    try:
        scale = float(text)
    except ValueError:
        scale = 0.0
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"{TIMEOUT_SCALE_VARIABLE}: expected a number > 0, got {text!r}")
    return scale


def scaled(seconds: float) -> float:
    """``seconds`` (a deadline on an idle machine) times ``timeout_scale()``."""
    return seconds * timeout_scale()


def line_within(stream: IO[str], seconds: float, what: str) -> str:
    """The next line a process writes to the pipe ``stream``; fails the test when none comes within ``seconds``
    (a hung process does not hang the suite)."""
    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"{what}: no line within {seconds:.0f} s"
    return stream.readline()
