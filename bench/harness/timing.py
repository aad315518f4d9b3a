"""Timing and table helpers shared by the benchmarks (stdlib only: the ORT venv imports it too)."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence


def time_steps(step: Callable[[], object], count: int, sync: Callable[[], None] | None = None) -> list[float]:
    """Seconds taken by each of ``count`` calls of ``step`` (``sync`` waits for queued device work)."""
    times = []
    for _ in range(count):
        if sync is not None:
            sync()
        start = time.perf_counter()
        step()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return times


def block_median_us(call: Callable[[], object], calls: int) -> float:
    """Median microseconds of ``calls`` calls."""
    return statistics.median(time_steps(call, calls)) * 1e6


def time_phased_steps(
    phases: Sequence[tuple[str, Callable[[], object]]], count: int, sync: Callable[[], None] | None = None
) -> dict[str, list[float]]:
    """Seconds of each phase and of the whole step ("step") for ``count`` steps, phases run in order.

    With ``sync`` (a device), every phase waits for its queued work, so phases are timed apart.
    """
    times: dict[str, list[float]] = {"step": [], **{name: [] for name, _ in phases}}
    for _ in range(count):
        if sync is not None:
            sync()
        start = previous = time.perf_counter()
        for name, phase in phases:
            phase()
            if sync is not None:
                sync()
            now = time.perf_counter()
            times[name].append(now - previous)
            previous = now
        times["step"].append(previous - start)
    return times


def interleaved_step_times(
    steps: dict[str, Callable[[], object]],
    *,
    rounds: int,
    steps_per_round: int,
    warmup: int,
    sync: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Per-step seconds of each contender, run in rounds A B C A B C ... so load drift hits all alike."""
    for step in steps.values():
        time_steps(step, warmup, sync)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name] += time_steps(step, steps_per_round, sync)
    return times


def median(values: Sequence[float]) -> float:
    """The median (of per-step seconds)."""
    return statistics.median(values)


def spread(round_medians: Sequence[float]) -> float:
    """(max - min) / median of the per-round medians: how much the rounds disagree."""
    if len(round_medians) < 2:
        return 0.0
    return (max(round_medians) - min(round_medians)) / statistics.median(round_medians)


def format_duration(seconds: float) -> str:
    """``812 us``, ``12.3 ms`` or ``1.23 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.3g} s"


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1, markdown: bool = False
) -> str:
    """A text or Markdown table: the first ``left`` columns left-aligned, the others right-aligned."""
    if markdown:
        lines = [
            "| " + " | ".join(headers) + " |",
            "|" + "|".join(["---"] * left + ["---:"] * (len(headers) - left)) + "|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) if i < left else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
