"""The ``train`` command's loop: progress, metrics file, TensorBoard, periodic saves and Ctrl-C.

Rates exclude compilation: with ``--compile`` the first step (which compiles) is timed on its own.
Ctrl-C finishes the step under way, saves the checkpoint and raises KeyboardInterrupt (exit 130);
a second Ctrl-C stops at once.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from ort_torch_train.cli.common import CliError
from ort_torch_train.progress import progress_bar

log = logging.getLogger(__name__)


@dataclass
class LoopResult:
    """What the loop did: each step's loss, seconds of steady steps and of compilation."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    compile_seconds: float | None = None
    saves: int = 0

    @property
    def steps_per_second(self) -> float:
        """Steady steps per second (the compiling step excluded)."""
        timed = len(self.losses) - (self.compile_seconds is not None)
        return timed / self.seconds if self.seconds > 0 and timed > 0 else float("nan")


class MetricsSink:
    """JSONL lines (``--metrics``) and TensorBoard scalars (``--tensorboard``), either optional."""

    def __init__(self, metrics_path: str | None, tensorboard_dir: str | None, every: int) -> None:
        self.every = every
        self.file: IO[str] | None = None
        self.writer: Any = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:
                raise CliError(
                    "--tensorboard needs the tensorboard package (pip install 'ort-torch-train[tensorboard]')"
                ) from error
            self.writer = SummaryWriter(tensorboard_dir)
        if metrics_path is not None:
            Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(metrics_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def step(self, step: int, loss: float, lr: float, rate: float, force: bool = False) -> None:
        """Record global step ``step`` (1-based) every ``every`` steps, or when ``force``."""
        if step % self.every and not force:
            return
        self._write({"step": step, "loss": loss, "lr": lr, "steps_per_s": None if math.isnan(rate) else rate})
        if self.writer is not None:
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/lr", lr, step)

    def record(self, step: int, **values: float) -> None:
        """Extra values at ``step`` (eval loss, compile time)."""
        self._write({"step": step, **values})
        if self.writer is not None:
            for name, value in values.items():
                self.writer.add_scalar(name.replace("_", "/", 1), value, step)

    def _write(self, line: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()

    def close(self) -> None:
        """Flush and close the file and the TensorBoard writer."""
        if self.file is not None:
            self.file.close()
        if self.writer is not None:
            self.writer.close()


@contextmanager
def deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """Within: the first SIGINT only sets a flag (read by the yielded function); a second one interrupts."""
    requested: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if requested:
            raise KeyboardInterrupt
        requested.append(signum)
        log.info("interrupt received: finishing the current step and saving")

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: keep the default behaviour
        yield lambda: False
        return
    try:
        yield lambda: bool(requested)
    finally:
        signal.signal(signal.SIGINT, previous)


def run_loop(
    step_fn: Callable[[int], tuple[float, float]],
    steps: range,
    save: Callable[[int], None],
    sink: MetricsSink,
    save_every: int | None,
    compiled: bool,
    quiet: bool,
    description: str,
) -> LoopResult:
    """Run ``step_fn(global_step) -> (loss, lr)`` over ``steps``; save every ``save_every`` steps.

    On Ctrl-C: saves at the last finished step and raises KeyboardInterrupt.
    """
    result = LoopResult()
    bar = progress_bar(len(steps), description, quiet)
    started = time.perf_counter()
    with deferred_interrupt() as interrupted:
        for step in steps:
            loss, lr = step_fn(step)
            if not math.isfinite(loss):
                bar.close()
                raise CliError(
                    f"the loss is {loss} at step {step + 1}: training diverged (try a lower --lr); nothing saved"
                )
            result.losses.append(loss)
            now = time.perf_counter()
            if compiled and result.compile_seconds is None:
                result.compile_seconds = now - started  # first step: compilation and one step
                log.info("first compiled step took %.1f s (compilation)", result.compile_seconds)
                sink.record(step + 1, compile_seconds=result.compile_seconds)
                bar.reset_clock()
                started = now
            result.seconds = now - started
            bar.update(loss=loss, lr=lr)
            sink.step(step + 1, loss, lr, result.steps_per_second, force=step == steps[-1])
            if save_every and (step + 1) % save_every == 0:
                save(step + 1)
                result.saves += 1
            if interrupted():
                bar.close()
                save(step + 1)
                raise KeyboardInterrupt
    bar.close()
    return result
