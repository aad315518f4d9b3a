"""The BLAS matrix products a converted graph runs, as recorded while its nodes ran on the examples.

``convert_graph`` runs every node once on example values; the products those runs dispatch (``mm``,
``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``addmv``: what ``linear``, ``matmul``, ``einsum`` and RNN
cells come down to) are what the graph's forward sends to BLAS, and its backward sends products of the
same sizes. ``MATRIX_PRODUCTS`` (``meta_keys.py``) keeps their multiply-accumulate counts, or None where
they are not all known (control flow: a Loop's or an If's products depend on values).
"""

from __future__ import annotations

import torch

from ort_torch_train.torch_internals import HigherOrderOperator, TorchDispatchMode

aten = torch.ops.aten
# positions of the two factors in each product's arguments
_FACTORS = {
    aten.mm.default: (0, 1),
    aten.addmm.default: (1, 2),
    aten.bmm.default: (0, 1),
    aten.baddbmm.default: (1, 2),
    aten.mv.default: (0, 1),
    aten.addmv.default: (1, 2),
}


class ProductRecorder(TorchDispatchMode):
    """Appends to ``sizes`` the multiply-accumulates of each matrix product run under it; ``complete``
    turns False when a higher-order op (``torch.cond``, ...) ran, whose inner products it cannot see."""

    supports_higher_order_operators = True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # conversion runs it, never a traced graph: no Dynamo-disabling wrapper (which imports Dynamo)
        return False

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.sizes = sizes
        self.complete = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, HigherOrderOperator):
            self.complete = False
        factors = _FACTORS.get(func)
        if factors is not None:
            a, b = args[factors[0]], args[factors[1]]
            self.sizes.append(a.numel() * (b.shape[-1] if b.dim() > 1 else 1))
        return func(*args, **(kwargs or {}))
