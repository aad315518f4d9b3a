"""``fit``'s stock callbacks: checkpoints (latest, numbered with keep-last-N, best), early stopping and
logging. Those that keep a state across runs (the best value, evaluations without improvement) keep
it in the checkpoint's properties, so a resumed run decides as the uninterrupted run would have.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from ort_torch_train.errors import InputError
from ort_torch_train.trainer.fit import Callback, FitState
from ort_torch_train.trainer.loggers import Logger
from ort_torch_train.trainer.metrics import Metric

log = logging.getLogger(__name__)
PROPERTY_PREFIX = "ort_torch_train."


def step_checkpoint_path(path: str | Path, step: int) -> Path:
    """Where ``SaveCheckpoints`` keeps the numbered checkpoint of ``step``: ``PATH.step-<step>``."""
    path = Path(path)
    return path.with_name(f"{path.name}.step-{step}")


def _say_nothing(text: str) -> None:
    """The default report: silence."""


class SaveCheckpoints(Callback):
    """Saves ``path`` every ``every`` steps and at the end (also after Ctrl-C or an early stop).

    ``keep_last``: each periodic save also writes ``PATH.step-<step>`` and the ``keep_last`` newest
    of those stay (older ones, from earlier runs too, are deleted). ``report`` gets one line per save.

    Args:
        path: the checkpoint to save (replaced atomically).
        every: also save every this many steps (None: only at the end).
        keep_last: keep this many numbered ``PATH.step-N`` checkpoints (None: none).
        report: called with a line after each save (the CLI prints it).
    """

    def __init__(
        self,
        path: str | Path,
        every: int | None = None,
        keep_last: int | None = None,
        report: Callable[[str], None] = _say_nothing,
    ) -> None:
        if keep_last is not None and (every is None or keep_last < 1):
            raise InputError("keep_last: needs periodic saves (every=N) and a count >= 1")
        self.path = Path(path)
        self.every = every
        self.keep_last = keep_last
        self.report = report
        self.saved_at: int | None = None

    def on_train_begin(self, run: FitState) -> None:
        """Make the checkpoint's folder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def on_step_end(self, run: FitState) -> None:
        """Save every ``every`` steps."""
        if self.every and run.step % self.every == 0:
            self._save(run)
            if self.keep_last:
                run.save(step_checkpoint_path(self.path, run.step))
                self._prune()

    def on_train_end(self, run: FitState) -> None:
        """Save the last step (unless just saved); reported after an interruption."""
        if self.saved_at != run.step:
            self._save(run, report=run.interrupted)

    def _save(self, run: FitState, report: bool = True) -> None:
        run.save(self.path)
        self.saved_at = run.step
        if report:
            self.report(f"step {run.step}: checkpoint saved to {self.path}")

    def numbered(self) -> list[Path]:
        """The numbered checkpoints present, oldest first."""
        pattern = re.compile(re.escape(self.path.name) + r"\.step-(\d+)$")
        found = [(int(m.group(1)), p) for p in self.path.parent.iterdir() if (m := pattern.match(p.name))]
        return [path for _, path in sorted(found)]

    def _prune(self) -> None:
        assert self.keep_last, "only periodic saves with keep_last prune"
        for old in self.numbered()[: -self.keep_last]:
            old.unlink(missing_ok=True)  # under data parallelism every rank prunes
            log.info("removed %s (keep_last %d)", old, self.keep_last)


class _Monitor(Callback):
    """Follows one evaluated metric; its best value is kept in the checkpoint's properties."""

    def __init__(self, metric: str, key: str) -> None:
        self.metric_name = metric
        self.best_key = f"{PROPERTY_PREFIX}{key}.best_{metric}"
        self.metric: Metric | None = None
        self.best: float | None = None

    def on_train_begin(self, run: FitState) -> None:
        """Find the metric among the evaluated ones; read the best value of an earlier run."""
        if self.metric_name not in run.monitored:
            raise InputError(
                f"metric {self.metric_name!r} is not evaluated (evaluated: {', '.join(run.monitored) or 'none'})"
            )
        self.metric = run.monitored[self.metric_name]
        properties = run.properties
        self.best = float(properties[self.best_key]) if self.best_key in properties else None

    def improved(self, run: FitState, metrics: dict[str, float]) -> bool:
        """Whether this evaluation beats the best; records it (in the properties) when it does."""
        assert self.metric is not None, "on_train_begin found the metric"
        value = metrics[self.metric_name]
        if not self.metric.improved(value, self.best):
            return False
        self.best = value
        run.properties[self.best_key] = value
        return True


class SaveBest(_Monitor):
    """Saves ``path`` whenever ``metric`` (a name ``fit`` evaluates) beats its best value so far.

    Args:
        path: where the best checkpoint is saved.
        metric: the evaluated metric's name.
        report: called with a line after each save.
    """

    def __init__(self, path: str | Path, metric: str, report: Callable[[str], None] = _say_nothing) -> None:
        super().__init__(metric, "save_best")
        self.path = Path(path)
        self.report = report
        self.best_step_key = f"{PROPERTY_PREFIX}save_best.step"

    def on_evaluate(self, run: FitState, metrics: dict[str, float]) -> None:
        """Save when the metric improved."""
        if self.improved(run, metrics):
            run.properties[self.best_step_key] = run.step
            self.path.parent.mkdir(parents=True, exist_ok=True)
            run.save(self.path)
            self.report(
                f"step {run.step}: best {self.metric_name} {metrics[self.metric_name]:.4g}, saved to {self.path}"
            )


class EarlyStopping(_Monitor):
    """Ends the run after ``patience`` evaluations in a row without ``metric`` improving.

    Args:
        metric: the evaluated metric's name.
        patience: evaluations in a row without improvement before stopping.
    """

    def __init__(self, metric: str, patience: int) -> None:
        if patience < 1:
            raise InputError(f"patience: expected an integer >= 1, got {patience!r}")
        super().__init__(metric, "early_stop")
        self.patience = patience
        self.waited_key = f"{PROPERTY_PREFIX}early_stop.waited"

    def on_evaluate(self, run: FitState, metrics: dict[str, float]) -> None:
        """Count evaluations without improvement; stop at ``patience``."""
        properties = run.properties
        waited = (
            0
            if self.improved(run, metrics)
            else int(properties[self.waited_key] if self.waited_key in properties else 0) + 1
        )
        properties[self.waited_key] = waited
        if waited >= self.patience:
            run.stop(f"early stop: {self.metric_name} did not improve in {waited} evaluations (best {self.best:.4g})")


class LogMetrics(Callback):
    """Sends the step's ``loss``, ``lr`` and ``steps_per_s`` every ``every`` steps (and the last step),
    each evaluation's ``eval_<metric>`` and the first step's ``compile_seconds`` to the loggers.

    Args:
        loggers: where the values go.
        every: steps between logged training values (the last step always).
        first_step_compiles: log the first step's time as ``compile_seconds``.
    """

    def __init__(self, loggers: Sequence[Logger], every: int = 1, first_step_compiles: bool = False) -> None:
        self.loggers = list(loggers)
        self.every = every
        self.first_step_compiles = first_step_compiles
        self.logged_at: int | None = None
        self.started = 0

    def _log(self, step: int, values: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log(step, values)

    def on_train_begin(self, run: FitState) -> None:
        """Remember the first step."""
        self.started = run.step

    def on_evaluate(self, run: FitState, metrics: dict[str, float]) -> None:
        """Log the evaluation."""
        if self.logged_at != run.step:
            self._log_step(run)
        self._log(run.step, {f"eval_{name}": value for name, value in metrics.items()})

    def on_step_end(self, run: FitState) -> None:
        """Log the step every ``every`` steps."""
        if self.first_step_compiles and run.step == self.started + 1 and run.first_step_seconds is not None:
            self._log(run.step, {"compile_seconds": run.first_step_seconds})
        if run.step % self.every == 0 and self.logged_at != run.step:
            self._log_step(run)

    def on_train_end(self, run: FitState) -> None:
        """Log the last step."""
        if self.logged_at != run.step and run.step > self.started:
            self._log_step(run)

    def _log_step(self, run: FitState) -> None:
        self.logged_at = run.step
        self._log(run.step, {"loss": run.loss, "lr": run.learning_rate, "steps_per_s": run.steps_per_second})

    def close(self) -> None:
        """Close the loggers."""
        for logger in self.loggers:
            logger.close()
