"""Progress bars on tqdm: steps, rate, ETA and the latest metrics on one line (stderr); status lines
printed past the bar (``status_line``, ``print``); log records and warnings kept off the bar's line
while it is live (``output_above_bar``); the library's long phases (``Phase``: reading a checkpoint,
converting a graph node by node, the graph passes, compiling), logged, and shown while ``phases_shown``
lasts."""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from types import TracebackType
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


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


def print(*values: object, sep: str = " ", end: str = "\n", file: TextIO | None = None) -> None:
    """``builtins.print`` that never lands on a progress bar's line: a live bar is cleared, the text
    printed, the bar redrawn below it (``tqdm.write``). Use it in callbacks of ``fit(progress=...)``.

    Examples:
        ```python
        from ort_torch_train.trainer import Callback, print

        class PrintLoss(Callback):
            def on_step_end(self, run) -> None:
                print(f"step {run.step}: loss {run.loss:.3f}")
        ```
    """
    tqdm.write(sep.join(str(value) for value in values), file=file, end=end)


@contextmanager
def output_above_bar(enabled: bool = True) -> Iterator[None]:
    """While it lasts, ``warnings`` and the root logger's console handlers (an application's
    ``logging.basicConfig``) write through ``tqdm.write``, above a live bar (the ``ort_torch_train``
    logger's own handler always does); nothing changes when ``enabled`` is False."""
    if not enabled:
        yield
        return
    shown = warnings.showwarning

    def show_above_bar(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        tqdm.write(text.rstrip("\n"), file=file or sys.stderr)

    warnings.showwarning = show_above_bar
    try:
        console = any(_is_console(handler) for handler in logging.root.handlers)
        with logging_redirect_tqdm([logging.root]) if console else nullcontext():
            yield
    finally:
        if warnings.showwarning is show_above_bar:
            warnings.showwarning = shown


def _is_console(handler: logging.Handler) -> bool:
    """Whether ``handler`` writes to the terminal (stdout or stderr)."""
    return isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (sys.stdout, sys.stderr)


_PHASES_SHOWN: ContextVar[bool] = ContextVar("ort_torch_train_phases_shown", default=False)


@contextmanager
def phases_shown(enabled: bool = True) -> Iterator[None]:
    """While it lasts (and ``enabled``), the library's long phases (``Phase``) show on stderr: a bar for a
    counted one, a line when each ends. Outside it they only log (quiet unless logging is enabled)."""
    token = _PHASES_SHOWN.set(enabled)
    try:
        yield
    finally:
        _PHASES_SHOWN.reset(token)


class Phase:
    """``with Phase(log, "converting the training graph", total=nodes, done="converted the training graph")
    as phase: ... phase.advance()``: an INFO record on ``logger`` when the phase starts and one with its
    seconds when it ends (``"<done> in 1.23 s"``, ``done`` by default ``"<description>: done"``; one saying it
    failed when it raises). Under ``phases_shown`` also a bar counting ``total`` units (without a total, a
    ``"<description> ..."`` line as it starts when stderr is a terminal) and the record's text on stderr
    when it ends; a phase that raises shows nothing more (whoever catches the error reports it)."""

    def __init__(
        self,
        logger: logging.Logger,
        description: str,
        *,
        total: int | None = None,
        unit: str = "node",
        done: str | None = None,
    ) -> None:
        self.logger, self.description, self.total, self.unit = logger, description, total, unit
        self.done = done if done is not None else f"{description}: done"
        self.bar: tqdm | None = None
        self.started = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Phase:
        counted = "" if self.total is None else f" ({self.total} {self.unit}s)"
        self.logger.info("%s%s ...", self.description, counted)
        if _PHASES_SHOWN.get() and self.total is None and sys.stderr.isatty():
            tqdm.write(f"{self.description} ...", file=sys.stderr)
        elif _PHASES_SHOWN.get() and self.total is not None:
            self.bar = tqdm(
                total=self.total, desc=self.description, unit=self.unit, file=sys.stderr, leave=False, mininterval=1.0
            )
        self.started = time.perf_counter()
        return self

    def advance(self, units: int = 1) -> None:
        """Count ``units`` more done."""
        if self.bar is not None:
            self.bar.update(units)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.seconds = time.perf_counter() - self.started
        if self.bar is not None:
            self.bar.close()
        ended = f"{self.done} in" if kind is None else f"{self.description}: failed after"
        self.logger.info("%s %.2f s", ended, self.seconds)
        if _PHASES_SHOWN.get() and kind is None:
            tqdm.write(f"{ended} {self.seconds:.1f} s", file=sys.stderr)
