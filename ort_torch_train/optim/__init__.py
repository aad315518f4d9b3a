"""optim: ORT's optimizer kernels (AdamW, SGD, gradient clipping), optimizer-model parsing and LR schedules.

Each optimizer op type is one record beside its kernel (``algorithm.py``; the registry is
``registry.py``). The optimizer core over a TrainingState is ``ort_torch_train.optim.engine.OptimizerEngine``,
running its kernel on the tensor lists a provider gives (``tensor_lists.py``).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ort_torch_train.optim.adamw import AdamWHyperparameters, adamw
    from ort_torch_train.optim.clip import clip_grad_norm_
    from ort_torch_train.optim.optimizer_model import OptimizerSpec, read_optimizer_model
    from ort_torch_train.optim.schedulers import constant_with_warmup, cosine_with_warmup, linear_with_warmup
    from ort_torch_train.optim.sgd import SGDHyperparameters, sgd

# each export -> its module, imported at first use: reading an optimizer model needs no torch
_EXPORTS = {
    "AdamWHyperparameters": "adamw_record",
    "OptimizerSpec": "optimizer_model",
    "SGDHyperparameters": "sgd_record",
    "adamw": "adamw",
    "clip_grad_norm_": "clip",
    "constant_with_warmup": "schedulers",
    "cosine_with_warmup": "schedulers",
    "linear_with_warmup": "schedulers",
    "read_optimizer_model": "optimizer_model",
    "sgd": "sgd",
}
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


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


class _Package(types.ModuleType):
    """This package, whose exports ``adamw`` and ``sgd`` stay the kernel functions when their modules (named
    alike) load later: the import system's binding of such a submodule here is left out, as it was when the
    package imported them eagerly."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
