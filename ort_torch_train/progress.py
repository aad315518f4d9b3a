"""Progress bars on tqdm: steps, rate, ETA and the latest metrics on one line (stderr); status lines
printed past the bar (``status_line``)."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


class ProgressBar:
    """``bar.update(loss=0.31)`` after each step; ``bar.close()`` at the end.

    A tqdm bar: redrawn in place on a terminal, otherwise a line about every ``mininterval``
    seconds and at the end. ``disable=True`` shows nothing (a quiet mode). ``initial``: the count it
    starts at (a resumed run's global step; ``total`` is then the global step it ends at). Its rate
    is the mean since ``reset_clock`` (no smoothing), over the steps after the first.
    """

    def __init__(
        self,
        total: int | None,
        description: str = "",
        stream: TextIO | None = None,
        disable: bool = False,
        mininterval: float = 1.0,
        initial: int = 0,
    ) -> None:
        self.bar = tqdm(
            total=None if total is None else max(int(total), initial + 1),
            initial=initial,
            smoothing=0,
            desc=description,
            file=stream or sys.stderr,
            unit="step",
            disable=disable,
            mininterval=mininterval,
            dynamic_ncols=True,
        )
        self.metrics: dict[str, str] = {}
        self._clock_reset = False

    def update(self, steps: int = 1, **metrics: float) -> None:
        """Advance by ``steps`` and show ``metrics`` (name=value) beside the bar."""
        self.metrics.update({name: f"{value:.4g}" for name, value in metrics.items()})
        self.bar.set_postfix(self.metrics, refresh=False)
        if self._clock_reset:  # the steps before the clock reset stay out of the rate
            self._clock_reset = False
            self.bar.initial = self.bar.n + steps
        self.bar.update(steps)

    def reset_clock(self) -> None:
        """Leave the time since the last update out of rate and ETA (call it after a compiling first
        step, before its ``update``)."""
        self.bar.unpause()  # tqdm's public API: moves its start and last-print times to now
        self._clock_reset = True

    def close(self) -> None:
        """Finish the bar (its last line shows the final count)."""
        self.bar.close()


def status_line(text: str) -> None:
    """Print ``text`` on stdout as its own line: a progress bar on the terminal is cleared first and
    redrawn below it, so the two never share a line."""
    tqdm.write(text)
