"""The ORT-shaped API: change ``onnxruntime.training.api`` to ``ort_torch_train.api``."""

from ort_torch_train.training.threads import set_threads

from .checkpoint_state import CheckpointState, Parameter, Parameters, Properties
from .module import Module
from .optimizer import ConstantWithWarmupLRScheduler, CosineLRScheduler, LinearLRScheduler, Optimizer
from .ortvalue import OrtValue

__all__ = [
    "CheckpointState",
    "ConstantWithWarmupLRScheduler",
    "CosineLRScheduler",
    "LinearLRScheduler",
    "Module",
    "Optimizer",
    "OrtValue",
    "Parameter",
    "Parameters",
    "Properties",
    "set_threads",
]
