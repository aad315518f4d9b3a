"""Progress bars on tqdm: steps, rate, ETA and the latest metrics on one line (stderr)."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


class ProgressBar:
    """``bar.update(loss=0.31)`` after each step; ``bar.close()`` at the end.

    A tqdm bar: redrawn in place on a terminal, otherwise a line about every ``mininterval``
    seconds and at the end. ``disable=True`` shows nothing (a quiet mode).
    """

    def __init__(
        self,
        total: int,
        description: str = "",
        stream: TextIO | None = None,
        disable: bool = False,
        mininterval: float = 1.0,
    ) -> None:
        self.bar = tqdm(
            total=max(int(total), 1),
            desc=description,
            file=stream or sys.stderr,
            unit="step",
            disable=disable,
            mininterval=mininterval,
            dynamic_ncols=True,
        )
        self.metrics: dict[str, str] = {}

    def update(self, steps: int = 1, **metrics: float) -> None:
        """Advance by ``steps`` and show ``metrics`` (name=value) beside the bar."""
        self.metrics.update({name: f"{value:.4g}" for name, value in metrics.items()})
        self.bar.set_postfix(self.metrics, refresh=False)
        self.bar.update(steps)

    def reset_clock(self) -> None:
        """Count rate and ETA from now on (after a compiling first step)."""
        if self.bar.disable:
            return
        self.bar.start_t = self.bar._time()
        self.bar.last_print_t = self.bar.start_t
        self.bar.initial = self.bar.n  # tqdm's rate is (n - initial) / elapsed

    def close(self) -> None:
        """Finish the bar (its last line shows the final count)."""
        self.bar.close()


def progress_bar(total: int, description: str, quiet: bool = False) -> ProgressBar:
    """A ProgressBar on stderr, or a silent one when ``quiet``."""
    return ProgressBar(total, description, disable=quiet)
