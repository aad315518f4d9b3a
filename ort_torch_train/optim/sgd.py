"""ORT's ``com.microsoft.SGDOptimizerV2`` as in-place torch kernels.

Reference: onnxruntime ``orttraining/training_ops/cpu/optimizer/sgd/sgd.cc`` (1.19.2), in float32:
``delta = -lr * g ; w = w + delta`` (no momentum, no weight decay). Every implementation rounds the
product before the addition, as ORT does (``add_(g, alpha=-lr)`` would fuse them into one FMA).
``SGD_ALGORITHM`` is the op's record (``sgd_record.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ort_torch_train.optim.algorithm import Hyperparameters, PreparedKernel
from ort_torch_train.optim.compiled import FusedUpdate, compiled, scalar_tensor
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.scratch import scaled_copy
from ort_torch_train.optim.sgd_record import IMPLEMENTATIONS
from ort_torch_train.optim.sgd_record import SGD_ALGORITHM as SGD_ALGORITHM  # re-exported: imported here too
from ort_torch_train.optim.sgd_record import SGDHyperparameters as SGDHyperparameters


@torch.no_grad()
def sgd(
    params: list[Tensor],
    grads: list[Tensor],
    hyperparameters: SGDHyperparameters,
    *,
    implementation: str | None = None,
    scratch: tuple[list[Tensor], ...] | None = None,
) -> None:
    """Apply ``w -= lr * g`` in place to every param; lr is used as float32, as in ORT.

    ``implementation``: "foreach" (the default), "single" (``single_tensor_sgd``, a per-tensor loop)
    or "compiled" (that loop through torch.compile). ``scratch`` (one list from
    ``make_scratch(params, 1)``) lets "foreach" run without allocating a temporary.
    """
    if len(params) == 0 or len(params) != len(grads):
        raise ValueError(
            f"sgd: params and grads must be non-empty lists of one length; got lengths ({len(params)}, {len(grads)})"
        )
    if implementation not in (None, *IMPLEMENTATIONS):
        raise ValueError(f"sgd: implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")
    negative_lr = -to_float32(hyperparameters.lr)
    if implementation == "single":
        single_tensor_sgd(params, grads, negative_lr)
    elif implementation == "compiled":
        compiled(single_tensor_sgd)(params, grads, scalar_tensor(negative_lr, params[0].device))
    else:
        torch._foreach_add_(params, scaled_copy(grads, negative_lr, scratch[0] if scratch else None))


def single_tensor_sgd(params: list[Tensor], grads: list[Tensor], negative_lr: float | Tensor) -> None:
    """``w += (-lr) * g``, the product rounded first as in ORT (traceable by torch.compile).

    ``negative_lr``: a float32 value, or a 0-d float32 tensor of it (compiled: it changes without a
    recompilation).
    """
    for w, g in zip(params, grads):
        w.add_(g * negative_lr)


# ---- the record of com.microsoft.SGDOptimizerV2 ------------------------------------------------


# ---- the kernels of SGD_ALGORITHM (sgd_record.py), called through the record ---------------------------
def kernel_default_implementation(params: list[Tensor], grads: list[Tensor], moments: list[list[Tensor]]) -> str:
    return "foreach"


def kernel_update(
    params: list[Tensor],
    grads: list[Tensor],
    moments: list[list[Tensor]],
    hyperparameters: Hyperparameters,
    step: int,
    kernel: PreparedKernel,
) -> None:
    if not isinstance(hyperparameters, SGDHyperparameters):
        raise TypeError(f"sgd: expected SGDHyperparameters; got {type(hyperparameters).__name__}")
    sgd(params, grads, hyperparameters, implementation=kernel.implementation, scratch=kernel.scratch)


def kernel_fused_update(hyperparameters: Hyperparameters, clip_max_norm: float | None) -> FusedUpdate:
    return FusedUpdate(single_tensor_sgd, (), clip_max_norm)


def kernel_step_scalars(hyperparameters: Hyperparameters, step: int) -> float:
    return -hyperparameters.lr
