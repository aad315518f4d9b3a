"""A Gather of one constant index (ViT's class token, picked from the sequence) in a compiled step: picked by
``index_select``, whose gradient inductor does not scatter into a view of zeros, so batch 1 stays in the
graph of the other sizes; eager keeps ``select``, the values the same."""

from __future__ import annotations

import pytest
import torch

from ort_torch_train.adapters.indexing import select_one
from ort_torch_train.torch_internals import compile_counters, size_one_kept_dynamic


def _class_token_loss(x: torch.Tensor, weight: torch.Tensor, pick=select_one) -> torch.Tensor:
    return (pick(torch.tanh(x), 1, 0) * weight).square().sum()


def test_eager_select_one_is_select():
    x = torch.randn(3, 5, 8)
    assert select_one(x, 1, 2).data_ptr() == x.select(1, 2).data_ptr()


@pytest.mark.compile
@pytest.mark.slow
def test_the_class_tokens_gradient_keeps_batch_1_in_one_inductor_graph():
    """torch.select: inductor's reinplacing of select's scatter guards the batch against 1 (two graphs);
    select_one: one graph, the gradients eager's."""
    graphs = []
    for pick in (torch.select, select_one):
        torch._dynamo.reset()
        compile_counters().clear()
        step = torch.compile(torch.func.grad(_class_token_loss), backend="inductor", dynamic=True)
        with size_one_kept_dynamic(True):
            for batch in (4, 3, 1, 2):
                x, weight = torch.randn(batch, 5, 8), torch.randn(8)
                expected = torch.func.grad(_class_token_loss)(x, weight, torch.select)
                torch.testing.assert_close(step(x, weight, pick), expected, rtol=0, atol=1e-6)
        graphs.append(compile_counters()["stats"]["unique_graphs"])
    assert graphs == [2, 1]
