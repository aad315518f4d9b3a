"""A dependency-free progress bar: steps, rate and the latest metrics on one line."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``bar.update(loss=0.31)`` after each step; ``bar.close()`` at the end.

    On a terminal the line is redrawn in place; otherwise a line is printed every ``every`` percent.
    """

    def __init__(self, total: int, description: str = "", stream: TextIO | None = None, every: int = 10, width: int = 24):
        self.total = max(int(total), 1)
        self.description = description
        self.stream = stream or sys.stderr
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = every
        self.width = width
        self.count = 0
        self.metrics: dict[str, float] = {}
        self.started = time.perf_counter()
        self._last_printed_percent = -1

    def update(self, steps: int = 1, **metrics: float) -> None:
        self.count += steps
        self.metrics.update(metrics)
        percent = 100 * self.count // self.total
        if self.interactive:
            self.stream.write("\r" + self.line())
            self.stream.flush()
        elif percent // self.every > self._last_printed_percent // self.every or self.count == self.total:
            self.stream.write(self.line() + "\n")
            self._last_printed_percent = percent

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        filled = self.width * self.count // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        metrics = " ".join(f"{name} {value:.4g}" for name, value in self.metrics.items())
        rate = self.count / elapsed
        return f"{self.description} [{bar}] {self.count}/{self.total} {rate:.1f} step/s {metrics}".strip()

    def close(self) -> None:
        if self.interactive:
            self.stream.write("\n")
        self.stream.flush()
