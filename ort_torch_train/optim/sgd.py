"""ORT's ``com.microsoft.SGDOptimizerV2`` as an in-place torch kernel.

Reference: onnxruntime ``orttraining/training_ops/cpu/optimizer/sgd/sgd.cc`` (1.19.2), in float32:
``delta = -lr * g ; w = w + delta`` (no momentum, no weight decay). Both implementations round the
product before the addition, as ORT does (``add_(g, alpha=-lr)`` would fuse them into one FMA).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ort_torch_train.optim.compiled import compiled_sgd
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.scratch import scaled_copy

IMPLEMENTATIONS = ("foreach", "single", "compiled")


@torch.no_grad()
def sgd(
    params: list[Tensor],
    grads: list[Tensor],
    *,
    lr: float,
    implementation: str | None = None,
    scratch: tuple[list[Tensor]] | None = None,
) -> None:
    """Apply ``w -= lr * g`` in place to every param; lr is used as float32, as in ORT.

    ``implementation``: "foreach" (the default), "single" (a per-tensor loop) or "compiled" (that
    loop through torch.compile). ``scratch`` (one
    list from ``make_scratch(params, 1)``) lets "foreach" run without allocating a temporary.
    """
    if len(params) == 0 or len(params) != len(grads):
        raise ValueError(
            f"sgd: params and grads must be non-empty lists of one length; got lengths ({len(params)}, {len(grads)})"
        )
    if implementation not in (None, *IMPLEMENTATIONS):
        raise ValueError(f"sgd: implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")
    negative_lr = -to_float32(lr)
    if implementation == "single":
        _single_update(params, grads, negative_lr)
    elif implementation == "compiled":
        compiled_sgd(params, grads, negative_lr)
    else:
        torch._foreach_add_(params, scaled_copy(grads, negative_lr, scratch[0] if scratch else None))


def _single_update(params: list[Tensor], grads: list[Tensor], negative_lr: float) -> None:
    for w, g in zip(params, grads):
        w.add_(g * negative_lr)
