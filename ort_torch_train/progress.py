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
        total: int | None,
        description: str = "",
        stream: TextIO | None = None,
        disable: bool = False,
        mininterval: float = 1.0,
    ) -> None:
        self.bar = tqdm(
            total=None if total is None else max(int(total), 1),
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
        """Leave the time since the last update out of rate and ETA (call it after a compiling first
        step, before its ``update``)."""
        self.bar.unpause()  # tqdm's public API: moves its start and last-print times to now

    def close(self) -> None:
        """Finish the bar (its last line shows the final count)."""
        self.bar.close()
