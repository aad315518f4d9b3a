"""The peak resident set a training step adds, measured in a fresh process (Linux; no tests here)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.helpers.timeouts import scaled


def status_mb(field: str) -> float:
    """A ``/proc/self/status`` field (VmRSS, VmHWM, ...) in MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024


def step_peak_growth_mb(step: Callable[[], object], warmup: int = 2, repeats: int = 3) -> float:
    """The least, over ``repeats`` calls after ``warmup`` ones, that a call of ``step`` raises the peak
    RSS above the RSS it started from (garbage of the call before collected first)."""
    for _ in range(warmup):
        step()
    growth = []
    for _ in range(repeats):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # the peak (VmHWM) starts again from the current RSS
        before = status_mb("VmRSS")
        step()
        growth.append(status_mb("VmHWM") - before)
    return min(growth)


def run_printing_mb(script: str, directory: Path) -> float:
    """Run ``script`` (which prints a figure last) in a fresh process with ``directory`` as its argument,
    glibc mmapping every allocation over 64 KiB so that freed tensors leave the resident set at once."""
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        env=environment,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return float(out.stdout.strip().splitlines()[-1])
