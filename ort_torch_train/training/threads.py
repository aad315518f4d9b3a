"""Intra-op threads that leave other processes' cores alone: ``set_threads``.

torch runs its operators, MKL's products and oneDNN on one OpenMP team of ``torch.get_num_threads()``
threads, and each parallel region ends at a barrier that waits for the team's slowest thread. When
another busy process takes a core, a team as wide as the machine waits at every region for the
thread the scheduler set aside while the others spin (OpenMP's default wait), and steps slow down
many times over now and then. Under the ``"auto"`` policy (the default of the library and the CLI)
the engine's CPU steps check, at most once a second (the first step: over the time since the
policy started), how many of this process's CPUs other processes kept busy since the last check
(``/proc/stat``, less this process's own CPU time; a compilation's worker processes count as this
process's) and run on the cores left: at least one, at most the count torch had when the policy
started (or that the caller set since with ``torch.set_num_threads``).

Auto changes the count with the load and, with it, the last bits of reductions and matrix products;
a pinned count repeats bit for bit whatever the load: ``set_threads(n)`` fixes n threads and
``set_threads("torch")`` leaves torch's count alone. Without a call the environment chooses, read
once at the first CPU step (``default_threads``):
``ORT_TORCH_TRAIN_THREADS`` ("auto", "torch" or n, as ``--threads`` takes it), else
``OMP_NUM_THREADS`` when set (torch's count, which OpenMP took from it), else auto.

Not covered: inductor's compiled loops keep the thread count they were compiled with. OpenMP's
waiting is read once, when torch loads OpenMP (``OMP_WAIT_POLICY=PASSIVE`` makes small steps several
times slower on an idle machine here: docs/performance.md, "Threads on a shared machine").
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

THREADS_VARIABLE = "ORT_TORCH_TRAIN_THREADS"  # pins the policy when set_threads is not called
POLICIES = ("auto", "torch")  # the settings besides a fixed count
CHECK_INTERVAL_S = 1.0
MIN_WINDOW_S = 0.1  # the shortest interval a first decision reads the load over
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

Sample = tuple[float, float, float]  # (monotonic s, busy CPU s of this process's CPUs, own CPU s)


@dataclass
class _Policy:
    """``setting``: "auto", "torch" or a fixed count (None: not chosen yet, ``default_threads`` decides);
    ``ceiling``/``applied``: auto's bounds and last choice; ``last``: the load sample the next decision
    reads the interval from."""

    setting: int | str | None = None
    ceiling: int | None = None
    applied: int | None = None
    next_check: float = 0.0
    last: Sample | None = None


def set_threads(threads: int | str) -> None:
    """The CPU steps' intra-op threads: ``"auto"`` (the default) follows the cores other processes leave
    free; an int n >= 1 fixes n threads; ``"torch"`` leaves torch's count as it is (as it was before
    auto changed it)."""
    if threads not in POLICIES and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(_expected("threads", threads))
    _choose(threads)
    if threads == "auto":
        _policy.last = _sample()


def parse_threads(text: str, source: str = "threads") -> int | str:
    """A setting written as text, as ``--threads`` and ``ORT_TORCH_TRAIN_THREADS`` take it: "auto",
    "torch" or an integer >= 1; a ValueError naming ``source`` otherwise."""
    if text in POLICIES:
        return text
    try:
        value = int(text)
    except ValueError:
        raise ValueError(_expected(source, text)) from None
    if value < 1:
        raise ValueError(_expected(source, text))
    return value


def default_threads() -> int | str:
    """The setting without a ``set_threads`` call: ``ORT_TORCH_TRAIN_THREADS`` when set; else "torch" when
    ``OMP_NUM_THREADS`` is set (the user pinned torch's count); else "auto"."""
    text = os.environ.get(THREADS_VARIABLE)
    if text:
        return parse_threads(text, THREADS_VARIABLE)
    return "torch" if os.environ.get("OMP_NUM_THREADS") else "auto"


def threads_setting() -> int | str:
    """The setting in effect: "auto", "torch" or the fixed count (``default_threads``, chosen once, until
    ``set_threads`` is called)."""
    setting = _policy.setting
    if setting is None:
        setting = default_threads()
        _choose(setting)
    return setting


def threads_for_load(cpus: int, other_busy: float, ceiling: int) -> int:
    """The thread count for ``cpus`` CPUs of which other processes keep ``other_busy`` busy (in CPUs):
    the free ones, a CPU counted free when under half busy; at least 1, at most ``ceiling``."""
    return max(1, min(ceiling, int(cpus - other_busy + 0.5)))


def follow_load() -> None:
    """Under the "auto" setting, at most once per ``CHECK_INTERVAL_S``: set torch's thread count to
    ``threads_for_load`` over the interval since the last sample (the first: since the policy started,
    at import or ``set_threads("auto")``). Called by the engine's CPU steps."""
    now = time.monotonic()
    if threads_setting() != "auto" or now < _policy.next_check:
        return
    current = torch.get_num_threads()
    if _policy.ceiling is None or current != _policy.applied:  # the caller's count (torch.set_num_threads)
        _policy.ceiling = _policy.applied = current
    last, sample = _policy.last, _sample()
    if sample is None or last is None or sample[0] - last[0] < MIN_WINDOW_S:
        _policy.last = last or sample
        _policy.next_check = now + MIN_WINDOW_S
        return
    _policy.last, _policy.next_check = sample, now + CHECK_INTERVAL_S
    cpus = len(_own_cpus())
    other_busy = max(0.0, (sample[1] - last[1]) - (sample[2] - last[2])) / (sample[0] - last[0])
    wanted = threads_for_load(cpus, other_busy, _policy.ceiling)
    if wanted != current:
        log.info(
            "threads: %d -> %d (other processes kept %.1f of %d CPUs busy; set_threads(n) or $%s=n fixes it)",
            current,
            wanted,
            other_busy,
            cpus,
            THREADS_VARIABLE,
        )
        torch.set_num_threads(wanted)
        _policy.applied = wanted


def restart_load_window() -> None:
    """Read the load from now on: called after a compilation, whose worker processes are this
    process's own work, not other processes'."""
    _policy.last = _sample()


def _choose(setting: int | str) -> None:
    """Make ``setting`` the policy; a count auto lowered goes back to auto's ceiling first."""
    if _policy.setting == "auto" and _policy.ceiling is not None and torch.get_num_threads() == _policy.applied:
        torch.set_num_threads(_policy.ceiling)
    _policy.setting, _policy.ceiling, _policy.applied, _policy.next_check = setting, None, None, 0.0
    if isinstance(setting, int):
        torch.set_num_threads(setting)


def _expected(source: str, value: object) -> str:
    return f"{source}: expected 'auto', 'torch' or an integer >= 1, got {value!r}"


def _sample() -> Sample | None:
    busy = _busy_cpu_seconds(_own_cpus())
    return None if busy is None else (time.monotonic(), busy, time.process_time())


def _own_cpus() -> list[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _busy_cpu_seconds(cpus: list[int]) -> float | None:
    """CPU seconds spent busy (not idle, not waiting for I/O) on ``cpus`` since boot; None without /proc/stat."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    try:
        with open("/proc/stat") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu")]
    except OSError:
        return None
    busy = 0
    for fields in lines:
        if fields[0] in wanted:
            ticks = [int(value) for value in fields[1:]]
            busy += sum(ticks[:8]) - ticks[3] - ticks[4]  # user..steal, less idle and iowait
    return busy / _TICKS_PER_S


_policy = _Policy(last=_sample())
