"""``fit``'s stock callbacks: checkpoints (latest, numbered with keep-last-N, best), early stopping and
logging. Those that keep a state across runs (the best value, evaluations without improvement) keep
it in the checkpoint's properties, so a resumed run decides as the uninterrupted run would have.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from ort_torch_train.errors import CheckpointError, InputError
from ort_torch_train.trainer.fit_state import Callback, FitState
from ort_torch_train.trainer.loggers import Logger
from ort_torch_train.trainer.metrics import Metric
from ort_torch_train.trainer.numbered import (
    WRITTEN_PROPERTY,
    check_numbered_names,
    remove_checkpoint_files,
    step_checkpoint_path,
    written_numbered,
)

log = logging.getLogger(__name__)
PROPERTY_PREFIX = "ort_torch_train."


def _say_nothing(text: str) -> None:
    """The default report: silence."""


class SaveCheckpoints(Callback):
    """Saves ``path`` every ``every`` steps and at the end (also after Ctrl-C or an early stop).

    ``keep_last``: each periodic save also writes ``PATH.step-<step>`` and the ``keep_last`` newest
    of those that this run wrote stay (with their ``.data`` and ``.manifest``). Which ones it wrote is
    kept in the checkpoint's properties, so a resumed run prunes its earlier ones too; files it did
    not write are never deleted, and one it would overwrite is refused before the first step.
    ``report`` gets one line per save.

    Args:
        path: the checkpoint to save (replaced atomically).
        every: also save every this many steps (None: only at the end).
        keep_last: keep this many of the numbered ``PATH.step-N`` checkpoints this run wrote (None: none).
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
        """Make the checkpoint's folder; refuse numbered checkpoints of another run that this run would replace."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.keep_last:
            check_numbered_names(self.path, run, self.every or 1)

    def on_step_end(self, run: FitState) -> None:
        """Save every ``every`` steps."""
        if self.every and run.step % self.every == 0:
            removed = []
            if self.keep_last:
                numbered = step_checkpoint_path(self.path, run.step)
                written = [*written_numbered(run, self.path), numbered.name]
                removed = written[: -self.keep_last]
                run.properties[WRITTEN_PROPERTY] = json.dumps(written[-self.keep_last :])
            self._save(run)
            if self.keep_last:
                run.save(numbered)
                for old in removed:
                    remove_checkpoint_files(self.path.with_name(old))
                    log.info("removed %s (keep_last %d)", old, self.keep_last)

    def on_train_end(self, run: FitState) -> None:
        """Save the last step (unless just saved); reported after an interruption."""
        if self.saved_at != run.step:
            self._save(run, report=run.interrupted)

    def _save(self, run: FitState, report: bool = True) -> None:
        run.save(self.path)
        self.saved_at = run.step
        if report:
            self.report(f"step {run.step}: checkpoint saved to {self.path}")


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
        if not math.isfinite(value) or not self.metric.improved(value, self.best):
            return False
        self.best = value
        run.properties[self.best_key] = value
        return True


class SaveBest(_Monitor):
    """Saves ``path`` whenever ``metric`` (a name ``fit`` evaluates) beats its best value so far. The evaluation
    after a Ctrl-C is not acted on (the resumed run saves where the whole run would).

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
        """Save when the metric improved (not on the evaluation after a Ctrl-C)."""
        if not run.interrupted and self.improved(run, metrics):
            run.properties[self.best_step_key] = run.step
            self.path.parent.mkdir(parents=True, exist_ok=True)
            run.save(self.path)
            self.report(
                f"step {run.step}: best {self.metric_name} {metrics[self.metric_name]:.4g}, saved to {self.path}"
            )


class EarlyStopping(_Monitor):
    """Ends the run after ``patience`` evaluations in a row without ``metric`` improving (a value that is not
    finite counts as no improvement, with a warning); the evaluation after a Ctrl-C does not count (the
    resumed run counts as the whole run would).

    A run resumed from a checkpoint whose run stopped early stays stopped when it is headed where that run
    was (the same ``max_steps``: repeating a command trains nothing more), and trains on, its count of
    evaluations without improvement started afresh, when asked for more: a larger ``max_steps`` than the
    stopped run's, a larger ``patience``, or ``train_on`` (steps counted from the checkpoint, as the CLI's
    ``--steps`` and ``--epochs`` count them).

    Args:
        metric: the evaluated metric's name.
        patience: evaluations in a row without improvement before stopping.
        train_on: a resumed run trains on after an early stop whatever its ``max_steps``.
        report: called with a line when a resumed run trains on after an early stop.
    """

    def __init__(
        self, metric: str, patience: int, *, train_on: bool = False, report: Callable[[str], None] = _say_nothing
    ) -> None:
        if patience < 1:
            raise InputError(f"patience: expected an integer >= 1, got {patience!r}")
        super().__init__(metric, "early_stop")
        self.patience = patience
        self.train_on = train_on
        self.report = report
        self.waited_key = f"{PROPERTY_PREFIX}early_stop.waited"
        self.target_key = f"{PROPERTY_PREFIX}early_stop.target"  # where the run that stopped was headed
        self.stopped_before = False
        self.reason: str | None = None  # why the patience ran out in this run (also at its last step)

    def on_train_begin(self, run: FitState) -> None:
        """Stay stopped when the checkpoint's run stopped early and this run asks for no more."""
        super().on_train_begin(run)
        waited = self._waited(run)
        self.stopped_before = waited >= self.patience
        if not self.stopped_before:
            return
        headed = self._count(run, self.target_key, None)
        why = f"{self.metric_name} did not improve in {waited} evaluations, patience {self.patience}"
        if self.train_on or (run.target_step is not None and headed is not None and run.target_step > headed):
            self.stopped_before = False
            run.properties[self.waited_key] = 0
            until = f" to step {run.target_step}" if run.target_step is not None else ""
            self.report(
                f"the checkpoint's run stopped early at step {run.step} ({why}): training on{until}, the "
                "evaluations without improvement counted afresh"
            )
            return
        more = f"a max_steps above {headed} (--max-steps), " if headed is not None else ""
        run.stop(f"early stop: the run stopped early at step {run.step} ({why}); give {more}a patience above {waited}")

    def _waited(self, run: FitState) -> int:
        waited = self._count(run, self.waited_key, 0)
        assert waited is not None, "the default is 0"
        return waited

    def _count(self, run: FitState, key: str, default: int | None) -> int | None:
        value = run.properties.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value != int(value):
            raise CheckpointError(f"checkpoint property {key!r} is {value!r}: expected an integer >= 0")
        return int(value)

    def on_evaluate(self, run: FitState, metrics: dict[str, float]) -> None:
        """Count evaluations without improvement; stop at ``patience``."""
        if self.stopped_before or run.interrupted:
            return
        value = metrics[self.metric_name]
        if not math.isfinite(value):
            log.warning("early stop: %s is %s at step %d: counted as no improvement", self.metric_name, value, run.step)
        waited = 0 if self.improved(run, metrics) else self._waited(run) + 1
        run.properties[self.waited_key] = waited
        if waited >= self.patience:
            best = "no finite value" if self.best is None else f"best {self.best:.4g}"
            run.properties[self.target_key] = run.target_step if run.target_step is not None else run.step
            self.reason = (
                f"early stop: {self.metric_name} did not improve in {waited} evaluations at step {run.step} "
                f"(patience {self.patience}; {best})"
            )
            run.stop(self.reason)


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
