"""The training loop as a library: ``fit`` runs ORT's loop over any iterable or DataLoader, with
callbacks for evaluation, checkpoints, early stopping and logging (see docs/training-loop.md)."""

from ort_torch_train.progress import print
from ort_torch_train.trainer.callbacks import EarlyStopping, LogMetrics, SaveBest, SaveCheckpoints
from ort_torch_train.trainer.classification import AUROC, F1Score, Precision, Recall
from ort_torch_train.trainer.data import ArrayDataset, ResumableBatchSampler, array_loader
from ort_torch_train.trainer.fit import fit
from ort_torch_train.trainer.fit_state import Callback, FitResult, FitState, TrainingDiverged
from ort_torch_train.trainer.loggers import JsonlLogger, Logger, MlflowLogger, TensorBoardLogger
from ort_torch_train.trainer.metric_base import StatefulMetric, TorchMetric
from ort_torch_train.trainer.metrics import (
    Accuracy,
    Loss,
    Metric,
    Perplexity,
    evaluate,
    metric_named,
    with_model_outputs,
)

__all__ = [
    "AUROC",
    "Accuracy",
    "ArrayDataset",
    "Callback",
    "EarlyStopping",
    "F1Score",
    "FitResult",
    "FitState",
    "JsonlLogger",
    "LogMetrics",
    "Logger",
    "Loss",
    "Metric",
    "MlflowLogger",
    "Perplexity",
    "Precision",
    "Recall",
    "ResumableBatchSampler",
    "SaveBest",
    "SaveCheckpoints",
    "StatefulMetric",
    "TensorBoardLogger",
    "TorchMetric",
    "TrainingDiverged",
    "array_loader",
    "evaluate",
    "fit",
    "metric_named",
    "print",
    "with_model_outputs",
]
