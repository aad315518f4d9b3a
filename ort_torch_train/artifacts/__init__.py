"""Generate ORT's on-device training artifacts without onnxruntime-training.

``generate_artifacts`` mirrors ``onnxruntime.training.artifacts.generate_artifacts`` (1.19.2);
``LossType``/``OptimType`` and the blocks mirror ``onnxruntime.training.onnxblock``. See docs/artifacts.md.
"""

from ort_torch_train.artifacts.blocks import (
    Abs,
    Add,
    Block,
    Cast,
    Constant,
    Div,
    InputLike,
    Log,
    Mul,
    Neg,
    PassThrough,
    Pow,
    ReduceMean,
    ReduceSum,
    Sigmoid,
    Sub,
    generate_graph_name,
)
from ort_torch_train.artifacts.generate import Artifacts, build_artifacts, generate_artifacts
from ort_torch_train.artifacts.losses import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    L1Loss,
    LanguageModelLoss,
    LossType,
    MSELoss,
)
from ort_torch_train.artifacts.optimizers import SGD, AdamW, ClipGradNorm, OptimType

__all__ = [
    "Abs",
    "Add",
    "AdamW",
    "Artifacts",
    "BCEWithLogitsLoss",
    "Block",
    "Cast",
    "ClipGradNorm",
    "Constant",
    "CrossEntropyLoss",
    "Div",
    "InputLike",
    "L1Loss",
    "LanguageModelLoss",
    "Log",
    "LossType",
    "MSELoss",
    "Mul",
    "Neg",
    "OptimType",
    "PassThrough",
    "Pow",
    "ReduceMean",
    "ReduceSum",
    "SGD",
    "Sigmoid",
    "Sub",
    "build_artifacts",
    "generate_artifacts",
    "generate_graph_name",
]
