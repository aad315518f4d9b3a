"""Where the loop's numbers go, behind one small protocol: ``log(step, values)`` and ``close()``.

Values are named as in the JSONL lines: ``loss``, ``lr``, ``steps_per_s`` for training steps,
``eval_<metric>`` for evaluations, ``compile_seconds`` for the first (compiling) step. TensorBoard and
MLflow file them under ``train/loss``, ``eval/accuracy``, ``compile/seconds``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from ort_torch_train.errors import InputError
from ort_torch_train.fileio import path_inside


class Logger(Protocol):
    """Receives the values of a global step (1-based optimizer step)."""

    def log(self, step: int, values: dict[str, float]) -> None:
        """Record ``values`` at ``step``."""

    def close(self) -> None:
        """Flush and release what the logger holds."""


def tag_of(name: str) -> str:
    """A value's TensorBoard/MLflow name: ``eval_loss`` -> ``eval/loss``, ``loss`` -> ``train/loss``."""
    group, underscore, rest = name.partition("_")
    if underscore and group in ("eval", "compile"):
        return f"{group}/{rest}"
    return f"train/{name}"


def finite_or_none(value: float) -> float | None:
    """``value``, or None for NaN (no rate yet)."""
    return None if isinstance(value, float) and math.isnan(value) else value


FLOAT32_MAX = float(np.finfo(np.float32).max)


def as_written(value: float) -> float:
    """A float32 value (a loss, a learning rate) as its shortest decimal, as the user wrote it
    (0.009999999776482582 -> 0.01); any other value unchanged."""
    if not isinstance(value, float) or not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        return value
    single = np.float32(value)
    return float(str(single)) if float(single) == value else value


class JsonlLogger:
    """One JSON line per ``log`` call, ``{"step": step, **values}``, appended to ``path``; float32 values
    (the loss, the learning rate) written as their shortest decimals (``as_written``).

    Args:
        path: the JSON-lines file appended to.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        target = path_inside(Path(path).parent, Path(path).name, "metrics file")  # a link out of it refused
        self.file: IO[str] = open(target, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def log(self, step: int, values: dict[str, float]) -> None:
        """Append one line and flush it."""
        line = {"step": step, **{name: finite_or_none(as_written(value)) for name, value in values.items()}}
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


class TensorBoardLogger:
    """Scalars in a TensorBoard event file under ``log_dir`` (needs the tensorboard package).

    Args:
        log_dir: the TensorBoard run folder.
    """

    def __init__(self, log_dir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise InputError(
                "TensorBoard logging needs the tensorboard package: python -m ort_torch_train.install --extra "
                "tensorboard (or pip install tensorboard)"
            ) from error
        self.writer = SummaryWriter(str(log_dir))

    def log(self, step: int, values: dict[str, float]) -> None:
        """Add each finite value as a scalar."""
        for name, value in values.items():
            if finite_or_none(value) is not None:
                self.writer.add_scalar(tag_of(name), value, step)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class MlflowLogger:
    """Metrics of one MLflow run (needs ``mlflow-skinny``).

    ``tracking`` is a tracking URI (``http://...``) or a local folder, used as MLflow's file store
    (``MLFLOW_ALLOW_FILE_STORE`` is set for it unless already set). ``parameters`` are logged once.

    Args:
        tracking: the MLflow tracking URI or folder.
        experiment: the experiment's name.
        run_name: the run's name (None: MLflow's).
        parameters: parameters logged once at the start.
    """

    def __init__(
        self,
        tracking: str | os.PathLike,
        experiment: str = "ort-torch-train",
        run_name: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise InputError(
                "MLflow logging needs mlflow: python -m ort_torch_train.install --extra mlflow (or pip install mlflow-skinny)"
            ) from error
        uri = str(tracking)
        if "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = Path(uri).resolve().as_uri()
        self.metric_type = Metric
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        if parameters:
            self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in parameters.items()])

    def log(self, step: int, values: dict[str, float]) -> None:
        """Log each finite value as a metric at ``step``."""
        now = int(time.time() * 1000)
        metrics = [
            self.metric_type(tag_of(name), float(value), now, step)
            for name, value in values.items()
            if finite_or_none(value) is not None
        ]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        """End the run."""
        self.client.set_terminated(self.run_id, "FINISHED")
