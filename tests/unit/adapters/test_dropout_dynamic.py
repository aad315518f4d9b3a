"""An active Dropout compiles under torch.func.grad with a dynamic batch axis (F.dropout there cannot trace
a symbolic size, so a compiled Dropout draws its mask itself), and keeps its expected scale."""

from __future__ import annotations

import pytest
import torch

from ort_torch_train.adapters.dropout import Dropout
from ort_torch_train.torch_internals import compile_counters


@pytest.mark.compile
def test_an_active_dropout_compiles_once_under_grad_for_every_batch_size():
    dropout = Dropout(active=True, ratio=0.25, with_mask=False)

    def gradient(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.func.grad(lambda w: dropout(x @ w).sum())(w)

    torch._dynamo.reset()
    compile_counters().clear()
    compiled = torch.compile(gradient, fullgraph=True, backend="aot_eager")
    w = torch.ones(3, 1000)
    for rows in (4, 7, 9):
        x = torch.ones(rows, 3)
        if rows == 4:
            torch._dynamo.mark_dynamic(x, 0)
        # each of the rows adds 1 / 0.75 to a column where it is kept, 0 where dropped: ``rows`` on average
        assert abs(float(compiled(x, w).mean()) / rows - 1) < 0.05
    assert compile_counters()["stats"]["unique_graphs"] == 1
