"""optim: ORT's optimizer kernels (AdamW, SGD, gradient clipping), optimizer-model parsing and LR schedules.

Each optimizer op type is one record beside its kernel (``algorithm.py``; the registry is
``registry.py``). The optimizer core over a TrainingState is ``ort_torch_train.optim.engine.OptimizerEngine``,
running its kernel on the tensor lists a provider gives (``tensor_lists.py``).
"""

from ort_torch_train.optim.adamw import AdamWHyperparameters, adamw
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.optimizer_model import OptimizerSpec, read_optimizer_model
from ort_torch_train.optim.schedulers import constant_with_warmup, cosine_with_warmup, linear_with_warmup
from ort_torch_train.optim.sgd import SGDHyperparameters, sgd

__all__ = [
    "AdamWHyperparameters",
    "OptimizerSpec",
    "SGDHyperparameters",
    "adamw",
    "clip_grad_norm_",
    "constant_with_warmup",
    "cosine_with_warmup",
    "linear_with_warmup",
    "read_optimizer_model",
    "sgd",
]
