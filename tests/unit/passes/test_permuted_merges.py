"""Merged axes of a permuted tensor in compiled graphs (passes/permuted_merges.py): the copied reshape gives
reshape's values and gradients exactly, the rewrite fires only on reshapes that lower a permute's rank,
and traced with a dynamic batch it keeps batch 1 in the graph of the other sizes."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.permuted_merges import copy_permuted_merges, reshape_copied
from ort_torch_train.torch_internals import compile_counters, size_one_kept_dynamic


def _merge_directions(y: torch.Tensor, weight: torch.Tensor, reshape=torch.reshape) -> torch.Tensor:
    """A bidirectional RNN's output (length, 2, batch, hidden) as (batch, length, 2 hidden), weighted."""
    merged = reshape(y.permute(0, 2, 1, 3), (y.shape[0], y.shape[2], -1))
    return (merged.permute(1, 0, 2) * weight).square().sum()


@pytest.mark.parametrize("batch", [1, 3])
def test_the_copied_reshape_has_reshapes_values_and_gradients(batch):
    torch.manual_seed(0)
    y, weight = torch.randn(5, 2, batch, 3), torch.randn(6)
    expected = torch.func.grad_and_value(_merge_directions)(y, weight)
    found = torch.func.grad_and_value(_merge_directions)(y, weight, reshape_copied)
    for a, e in zip(found, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


class _Recording(fx.Interpreter):
    """Runs a graph, keeping each node's tensor as its ``meta["val"]`` (as the conversion does)."""

    def run_node(self, node: fx.Node) -> object:
        value = super().run_node(node)
        node.meta["val"] = value if isinstance(value, torch.Tensor) else None
        return value


def test_only_reshapes_that_merge_a_permutes_axes_are_rewritten():
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        permuted = x.permute(0, 2, 1, 3)
        return permuted.reshape(5, 4, 6), permuted.reshape(5, 4, 2, 3, 1), x.reshape(5, 8, 3), x.flatten(2)

    module = fx.symbolic_trace(forward)
    example = torch.randn(5, 2, 4, 3)
    _Recording(module).run(example)
    copy_permuted_merges(module, torch.device("cpu"))
    module.recompile()
    assert [node.target for node in module.graph.nodes if node.op != "placeholder"].count(reshape_copied) == 1
    assert FUSIONS.get(module, {})["permuted_merges_copied"] == 1
    for got, expected in zip(module(example), forward(example)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.compile
def test_a_dynamic_batch_traces_one_graph_with_batch_1():
    """Plain reshape: a guard that the batch is not 1 (a second graph); the copied reshape: one graph, with
    the gradient (whose own reshape would guard again)."""
    graphs = []
    for reshape in (torch.reshape, reshape_copied):
        torch._dynamo.reset()
        compile_counters().clear()
        step = torch.compile(torch.func.grad(_merge_directions), backend="aot_eager", dynamic=True)
        with size_one_kept_dynamic(True):
            for length, batch in [(16, 4), (9, 3), (23, 1), (7, 2)]:
                y, weight = torch.randn(length, 2, batch, 3), torch.randn(6)
                torch.testing.assert_close(step(y, weight, reshape), torch.func.grad(_merge_directions)(y, weight))
        graphs.append(compile_counters()["stats"]["unique_graphs"])
    assert graphs == [2, 1]
