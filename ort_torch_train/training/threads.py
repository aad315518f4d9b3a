"""Intra-op threads that leave other processes' cores alone: the process's ``ThreadPolicy``, ``set_threads``.

torch runs its operators, MKL's products and oneDNN on one OpenMP team of ``torch.get_num_threads()``
threads, and each parallel region ends at a barrier that waits for the team's slowest thread. When
another busy process takes a core, a team as wide as the machine waits at every region for the
thread the scheduler set aside while the others spin (OpenMP's default wait), and steps slow down
(docs/performance.md, "Threads on a shared machine", measures it). Under the ``"auto"`` policy (the
default of the library and the CLI) the engine's CPU steps call ``follow_load``, which checks, at most
once per ``CHECK_INTERVAL_S`` (the first decision: over the time since the policy's first use), how many
of this process's CPUs other processes kept busy since the last check (``/proc/stat``, less this
process's own CPU time; a compilation's worker processes count as this process's) and runs on the cores
left: at least one, at most the count torch had at the first check (or that the caller set since with
``torch.set_num_threads``).

Auto changes the count with the load and, with it, the last bits of reductions and matrix products;
a pinned count repeats bit for bit whatever the load: ``set_threads(n)`` fixes n threads and
``set_threads("torch")`` leaves torch's count alone. Without a call the environment chooses, read
once at the policy's first use (``default_threads``):
``ORT_TORCH_TRAIN_THREADS`` ("auto", "torch" or n, as ``--threads`` takes it), else
``OMP_NUM_THREADS`` when set (torch's count, which OpenMP took from it), else auto.

The policy is this package's one process-wide setting of its own: torch keeps a single thread count per
process, so every engine follows one ``ThreadPolicy``, ``process_threads()`` (an engine takes it when
built and hands it to its compiled steps), which ``set_threads`` and the CLI's ``--threads`` set. It reads nothing and sets nothing at import; it changes torch's count
through ``torch_settings.py``, where the package's process-wide torch settings are listed. The policy in
effect is logged (info: the CLI's ``-v``, ``ORT_TORCH_TRAIN_LOG=info``) when chosen, and at its first use
when the environment chooses it.

A compiled step follows the load once, when it compiles, and then ``hold``s that count: inductor's
compiled loops keep the thread count they were compiled with, and Dynamo's guards check it (another
count would compile the step again). OpenMP's waiting is read once, when torch loads OpenMP (the same
section measures ``OMP_WAIT_POLICY=PASSIVE``).
"""

from __future__ import annotations

import logging
import os
import time

import torch

from ort_torch_train.training.torch_settings import set_intra_op_threads

log = logging.getLogger(__name__)

THREADS_VARIABLE = "ORT_TORCH_TRAIN_THREADS"  # pins the policy when set_threads is not called
POLICIES = ("auto", "torch")  # the settings besides a fixed count
CHECK_INTERVAL_S = 1.0
MIN_WINDOW_S = 0.1  # the shortest interval a first decision reads the load over
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

Sample = tuple[float, float, float]  # (monotonic s, busy CPU s of this process's CPUs, own CPU s)


class ThreadPolicy:
    """How many intra-op threads the CPU steps run on: "auto", "torch" or a fixed count (``set_threads``).

    Until ``choose`` is called the environment decides, at the first use (``default_threads``). Under
    auto, ``follow_load`` sets torch's count from the load over the interval since its last sample.
    """

    def __init__(self) -> None:
        self._setting: int | str | None = None  # None: not chosen yet
        self._ceiling: int | None = None  # auto's upper bound: torch's count when auto first checked
        self._applied: int | None = None  # auto's last choice
        self._next_check = 0.0
        self._last: Sample | None = None  # the sample the next decision reads the interval from

    def choose(self, threads: int | str, source: str = "set_threads") -> None:
        """Make ``threads`` the setting: "auto", "torch" or an int n >= 1 (torch's count set to n at once);
        a count auto lowered goes back to auto's ceiling first. Logs the policy (info), naming ``source``."""
        if threads not in POLICIES and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ValueError(_expected("threads", threads))
        self._apply(threads)
        if threads == "auto":
            self._last = _sample()
        log.info("threads: %s (%s)", describe(threads), source)

    def setting(self) -> int | str:
        """The setting in effect: "auto", "torch" or the fixed count (``default_threads``, chosen once, until
        ``choose`` is called, and logged then)."""
        setting = self._setting
        if setting is None:
            setting = default_threads()
            self._apply(setting)
            log.info("threads: %s (%s)", describe(setting), default_source())
        return setting

    def follow_load(self, device: torch.device) -> None:
        """Before a step on ``device``: on CPU under the "auto" setting, at most once per ``CHECK_INTERVAL_S``,
        set torch's thread count to ``threads_for_load`` over the interval since the last sample (the
        first call only takes a sample)."""
        if device.type != "cpu":
            return
        now = time.monotonic()
        if now < self._next_check or self.setting() != "auto":
            return
        current = torch.get_num_threads()
        if self._ceiling is None or current != self._applied:  # the caller's count (torch.set_num_threads)
            self._ceiling = self._applied = current
        last, sample = self._last, _sample()
        if sample is None or last is None or sample[0] - last[0] < MIN_WINDOW_S:
            self._last = last or sample
            self._next_check = now + MIN_WINDOW_S
            return
        self._last, self._next_check = sample, now + CHECK_INTERVAL_S
        cpus = len(_own_cpus())
        other_busy = max(0.0, (sample[1] - last[1]) - (sample[2] - last[2])) / (sample[0] - last[0])
        wanted = threads_for_load(cpus, other_busy, self._ceiling)
        if wanted != current:
            log.info(
                "threads: %d -> %d (other processes kept %.1f of %d CPUs busy; set_threads(n) or $%s=n fixes it)",
                current,
                wanted,
                other_busy,
                cpus,
                THREADS_VARIABLE,
            )
            set_intra_op_threads(wanted)
            self._applied = wanted

    def hold(self, count: int, device: torch.device) -> None:
        """Before a compiled step on ``device`` that was compiled at ``count`` threads: under "auto", torch's
        count goes back to ``count``. Inductor's loops keep the count they were compiled with, and Dynamo's
        guards check it, so another count would only compile the step again."""
        if device.type != "cpu" or self.setting() != "auto" or torch.get_num_threads() == count:
            return
        log.info("threads: %d -> %d (the count the compiled step was compiled at)", torch.get_num_threads(), count)
        set_intra_op_threads(count)
        self._applied = count

    def restart_load_window(self) -> None:
        """Read the load from now on: called after a compilation, whose worker processes are this
        process's own work, not other processes'."""
        if self._last is not None:
            self._last = _sample()

    def _apply(self, setting: int | str) -> None:
        if self._setting == "auto" and self._ceiling is not None and torch.get_num_threads() == self._applied:
            set_intra_op_threads(self._ceiling)
        self._setting, self._ceiling, self._applied, self._next_check = setting, None, None, 0.0
        if isinstance(setting, int):
            set_intra_op_threads(setting)


_PROCESS_THREADS = ThreadPolicy()  # torch's thread count is the process's: one policy for every engine


def process_threads() -> ThreadPolicy:
    """The process's thread policy: the one ``set_threads`` sets and every engine's CPU steps follow."""
    return _PROCESS_THREADS


def set_threads(threads: int | str) -> None:
    """The CPU steps' intra-op threads: ``"auto"`` (the default) follows the cores other processes leave
    free; an int n >= 1 fixes n threads; ``"torch"`` leaves torch's count as it is (as it was before
    auto changed it)."""
    process_threads().choose(threads)


def threads_setting() -> int | str:
    """The process policy's setting in effect: "auto", "torch" or the fixed count."""
    return process_threads().setting()


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


def default_source() -> str:
    """What chose ``default_threads``' setting, in words: the variable that pinned it, or the default."""
    text = os.environ.get(THREADS_VARIABLE)
    if text:
        return f"${THREADS_VARIABLE}={text}"
    return f"$OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}" if os.environ.get("OMP_NUM_THREADS") else "the default"


def describe(setting: int | str) -> str:
    """A setting as the policy's one-line log says it: what it runs on and whether runs repeat bit for bit."""
    count = torch.get_num_threads()
    if setting == "auto":
        return (
            f"auto, at most {count}, fewer while other processes keep CPUs busy: results follow the load in their "
            f"last bits (a fixed count repeats them: --deterministic, --threads N or ${THREADS_VARIABLE}=N)"
        )
    if setting == "torch":
        return f"torch's count, {count}, fixed: CPU steps repeat bit for bit"
    return f"{setting}, fixed: CPU steps repeat bit for bit"


def threads_for_load(cpus: int, other_busy: float, ceiling: int) -> int:
    """The thread count for ``cpus`` CPUs of which other processes keep ``other_busy`` busy (in CPUs):
    the free ones, a CPU counted free when under half busy; at least 1, at most ``ceiling``."""
    return max(1, min(ceiling, int(cpus - other_busy + 0.5)))


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
