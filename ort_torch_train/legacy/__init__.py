"""The legacy ``onnxruntime.TrainingSession`` API (ORT 1.4-1.13): change ``onnxruntime`` to
``ort_torch_train.legacy`` for ``TrainingSession``, ``TrainingParameters`` and ``RunOptions``."""

from .metadata import ModelMetadata, NodeArg, RunOptions
from .parameters import TrainingParameters
from .session import TrainingSession

__all__ = ["ModelMetadata", "NodeArg", "RunOptions", "TrainingParameters", "TrainingSession"]
