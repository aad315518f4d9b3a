"""Run the configurations of one model in worker processes, interleaved round by round."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from model_artifacts import ORT_PYTHON, ArtifactSet
from models import LEARNING_RATE, BenchModel
from timing import median

HARNESS = Path(__file__).resolve().parent
SETUP_TIMEOUT_S = 1800  # inductor compiles the encoder's graphs in minutes on two cores
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Settings:
    """How every configuration is run."""

    threads: int
    device: str
    rounds: int
    steps: int | None  # timed steps per round; None: the model's default
    warmup: int | None  # None: the model's default
    torch_inputs: bool = False  # feed (a) and (b) torch tensors instead of numpy arrays
    precision: str | None = None  # autocast dtype of the torch configurations (runners.PRECISIONS); None: float32
    sequential_setup: bool = False  # start each worker once the one before is ready: setups timed apart

    def steps_for(self, model: BenchModel) -> int:
        return self.steps if self.steps is not None else model.steps

    def warmup_for(self, model: BenchModel) -> int:
        return self.warmup if self.warmup is not None else model.warmup


@dataclass
class ConfigResult:
    """The per-step times of one configuration of one model, or why there are none."""

    model: str
    config: str
    times: dict[str, list[float]] = field(default_factory=dict)  # "step" and each phase, all rounds
    round_medians: list[float] = field(default_factory=list)
    peak_memory_mb: float | None = None
    last_loss: float | None = None
    setup_s: float | None = None  # load, first step and the other warmup steps
    load_s: float | None = None  # the runner built: checkpoint read, conversion, binding (ORT: its session)
    first_step_s: float | None = None
    rss_after_load_mb: float | None = None  # peak RSS once loaded, before the first step
    attention_kernels: list[str] | None = None  # the attention ops/kernels of one profiled step (not ORT)
    error: str | None = None

    def median(self, phase: str = "step") -> float | None:
        """Median seconds of a phase (or the whole step) over all timed steps."""
        return median(self.times[phase]) if self.times.get(phase) else None


class WorkerError(RuntimeError):
    """A worker died, timed out or answered nonsense."""


class WorkerProcess:
    """bench/harness/worker.py for one configuration, with its stderr in a log file."""

    def __init__(
        self, python: Path | str, config: str, model: BenchModel, artifacts: ArtifactSet, settings: Settings, log: Path
    ):
        # On CPU inductor compiles in-process: its pool of compile subprocesses would otherwise keep booting
        # in the background after a cache hit and steal the CPU from whichever configuration is timed.
        # On CUDA the step runs on the GPU, and the pool compiles the Triton kernels in parallel.
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(settings.threads),
            MKL_NUM_THREADS=str(settings.threads),
            PYTHONUNBUFFERED="1",
        )
        if not settings.device.startswith("cuda"):
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        command = [
            str(python),
            str(HARNESS / "worker.py"),
            "--config",
            config,
            "--model",
            model.name,
            "--artifacts",
            str(artifacts.directory),
            "--threads",
            str(settings.threads),
            "--device",
            settings.device,
            "--lr",
            str(LEARNING_RATE),
            "--warmup",
            str(settings.warmup_for(model)),
        ] + (["--torch-inputs"] if settings.torch_inputs else [])
        if settings.precision and config != "ort":
            command += ["--mixed-precision", settings.precision]
        self.log = log
        with open(log, "wb") as stderr:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=HARNESS, env=env
            )
        self._buffer = b""

    def request(self, command: str, timeout: float) -> dict:
        """Send one command line and wait for its answer."""
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()
        return self.receive(timeout)

    def receive(self, timeout: float) -> dict:
        """The next answer line, parsed."""
        deadline = time.monotonic() + timeout
        stdout = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(f"no answer within {timeout:.0f} s")
            if select.select([stdout], [], [], remaining)[0]:
                chunk = os.read(stdout, 1 << 16)
                if not chunk:
                    raise WorkerError(f"worker exited ({self.process.wait()}): {self.log_tail()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def log_tail(self, lines: int = 3) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(no stderr)"

    def stop(self) -> None:
        """End the worker if it still runs (it is this run's own child)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def run_model(
    model: BenchModel, artifacts: ArtifactSet, configs: list[str], settings: Settings, log_dir: Path, progress=print
) -> list[ConfigResult]:
    """Start every configuration, then time them in rounds A B C D A B C D ...; one result per config."""
    results = {config: ConfigResult(model.name, config) for config in configs}
    workers: dict[str, WorkerProcess] = {}

    def start(config: str) -> None:
        python = ORT_PYTHON if config == "ort" else sys.executable
        workers[config] = WorkerProcess(
            python, config, model, artifacts, settings, log_dir / f"{model.name}-{config}.log"
        )

    try:
        if not settings.sequential_setup:
            for config in configs:
                start(config)
        for config in configs:
            if settings.sequential_setup:
                with _others_stopped(workers, None):
                    start(config)
                    _call(results[config], workers, config, lambda w: w.receive(SETUP_TIMEOUT_S), "setup")
            else:
                _call(results[config], workers, config, lambda w: w.receive(SETUP_TIMEOUT_S), "setup")
            if config in workers:
                progress(f"  {config}: ready after {results[config].setup_s:.1f} s")
        steps = settings.steps_for(model)
        for round_index in range(settings.rounds):
            for config in list(workers):
                with _others_stopped(workers, config):
                    answer = _call(
                        results[config],
                        workers,
                        config,
                        lambda w: w.request(f"run {steps}", RUN_TIMEOUT_S),
                        f"round {round_index + 1}",
                    )
                if answer:
                    for phase, values in answer.items():
                        results[config].times.setdefault(phase, []).extend(values)
                    results[config].round_medians.append(median(answer["step"]))
            progress(f"  round {round_index + 1}/{settings.rounds} done")
        for config in list(workers):
            _call(results[config], workers, config, lambda w: w.request("quit", 60), "quit")
    finally:
        for worker in workers.values():
            worker.stop()
    return list(results.values())


@contextlib.contextmanager
def _others_stopped(workers: dict[str, WorkerProcess], config: str | None):
    """Suspend every worker but ``config``'s while it is timed: an idle ORT session's pool threads keep
    spinning and took up to a third of a 2-core machine from the configuration being timed."""
    others = [w for name, w in workers.items() if name != config and w.process.poll() is None]
    stop = getattr(signal, "SIGSTOP", None)
    if stop is None:  # Windows: no job control
        yield
        return
    for worker in others:
        os.kill(worker.process.pid, stop)
    try:
        yield
    finally:
        for worker in others:
            if worker.process.poll() is None:
                os.kill(worker.process.pid, signal.SIGCONT)


def _call(result: ConfigResult, workers: dict[str, WorkerProcess], config: str, action, stage: str) -> dict | None:
    """Run ``action`` on a worker and file its answer; a failure is recorded and the worker dropped."""
    worker = workers[config]
    try:
        answer = action(worker)
    except (WorkerError, BrokenPipeError, json.JSONDecodeError) as exc:
        result.error = f"failed at {stage}: {exc}"
        worker.stop()
        del workers[config]
        return None
    if "ready" in answer:
        result.setup_s = answer["setup_s"]
        result.load_s, result.first_step_s = answer.get("load_s"), answer.get("first_step_s")
        result.rss_after_load_mb = answer.get("rss_after_load_mb")
    if "peak_memory_mb" in answer:
        result.peak_memory_mb, result.last_loss = answer["peak_memory_mb"], answer["last_loss"]
        result.attention_kernels = answer.get("attention_kernels")
    return answer
