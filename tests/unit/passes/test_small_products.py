"""Small matrix products as a multiply and a sum (``passes/small_products.py``) in a package's train step: the mlp
fixture's step, exported with its batch dynamic as ``ort-torch-train package`` exports it, keeps its results (loss,
gradients) to float32 rounding at two batch sizes while its small products leave the graph and large ones stay."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from ort_torch_train.passes.small_products import MAX_STATIC_EXTENTS, small_products
from tests.helpers.exported_steps import exported_train_step
from tests.helpers.fixture_runs import fixture_batches

CASE = "mlp_ce_adamw_sched"  # layers 20 -> 32 -> 5: products of 640 and 160 static elements
PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def _exported(case: str) -> tuple[torch.export.ExportedProgram, list[Tensor], int]:
    """The fixture's train step exported as the package build exports it, decomposed to ATen's core products."""
    return exported_train_step(case, decomposed=True)


@pytest.fixture(scope="module")
def train_step() -> tuple[torch.export.ExportedProgram, list[Tensor], int]:
    return _exported(CASE)


def _run(program: torch.export.ExportedProgram, state: list[Tensor], batch: list[np.ndarray]) -> list[Tensor]:
    """The step's loss and the gradients it writes, on fresh copies of ``state``."""
    arguments = [torch.from_numpy(array) for array in batch] + [tensor.clone() for tensor in state]
    outputs = program.module()(*arguments)
    return [outputs[0], *arguments[len(batch) : -1]]


def _products(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [node for node in program.graph.nodes if node.target in PRODUCTS]


def test_small_products_leave_the_train_step_and_its_results_hold(train_step) -> None:
    program, state, _ = train_step
    train, _ = fixture_batches(CASE, 2)
    batches = [train[0], [np.concatenate([a, b])[:11] for a, b in zip(train[0], train[1])]]  # 8 and 11 rows
    before = [_run(program, state, batch) for batch in batches]
    shapes = [(node.args[-2].meta["val"].shape, node.args[-1].meta["val"].shape) for node in _products(program)]
    assert len(shapes) == 5  # two forward products, the second layer's input gradient, both weight gradients
    assert small_products(program.graph_module.graph, 0) == 0

    rewritten = small_products(program.graph_module.graph)
    program.graph_module.recompile()
    static = [
        np.prod([extent for extent in (a[0], a[1], b[1]) if isinstance(extent, int)]) for a, b in shapes
    ]  # the batch is symbolic in each: a row, the contraction or a column
    assert rewritten == sum(size <= MAX_STATIC_EXTENTS for size in static) == 3
    assert len(_products(program)) == 2  # the first layer's forward product and weight gradient (640 each)
    for batch, expected in zip(batches, before):
        for got, want in zip(_run(program, state, batch), expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert expected[0].item() > 0  # a real loss, not a zero graph


def test_products_over_the_tokens_of_a_sequence_stay_extern_gemms() -> None:
    """The tinyformer's products over batch x 6 token rows do 6 times their static extents' multiply-adds per
    sample (over the limit even where the extents alone are 16 x 16); its classifier head's, over the batch, do not."""
    program, state, _ = _exported("transformer")
    train, _ = fixture_batches("transformer", 1)
    before = _run(program, state, train[0])
    assert len(_products(program)) == 14
    assert small_products(program.graph_module.graph) == 3
    program.graph_module.recompile()
    for node in _products(program):  # the tokens are the rows of a product or (a weight's gradient) its contraction
        symbolic = [str(extent) for extent in node.args[-2].meta["val"].shape if not isinstance(extent, int)]
        assert len(symbolic) == 1 and symbolic[0].startswith("6*"), node.format_node()
    for got, want in zip(_run(program, state, train[0]), before):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
