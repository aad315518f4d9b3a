"""``addmm`` as a product and an add (``passes/unfused_addmm.py``) in a package's train step: the mlp fixture's step,
exported as ``ort-torch-train package`` exports it, after the small products' pass as the package's programs run it,
keeps its results (loss, gradients) to float32 rounding at two batch sizes while no ``addmm`` is left."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_train.passes.small_products import small_products
from ort_torch_train.passes.unfused_addmm import unfuse_addmm
from tests.helpers.exported_steps import exported_train_step
from tests.helpers.fixture_runs import fixture_batches

CASE = "mlp_ce_adamw_sched"  # layers 20 -> 32 -> 5: the first layer's forward product is too large for small_products


def _targets(graph: torch.fx.Graph) -> list[object]:
    return [node.target for node in graph.nodes if node.op == "call_function"]


def _run(program: torch.export.ExportedProgram, state: list[Tensor], batch: list[np.ndarray]) -> list[Tensor]:
    """The step's loss and the gradients it writes, on fresh copies of ``state``."""
    arguments = [torch.from_numpy(array) for array in batch] + [tensor.clone() for tensor in state]
    outputs = program.module()(*arguments)
    return [outputs[0], *arguments[len(batch) : -1]]


def test_the_train_steps_addmm_becomes_a_product_and_an_add_and_its_results_hold() -> None:
    program, state, _ = exported_train_step(CASE, decomposed=True)
    train, _ = fixture_batches(CASE, 2)
    batches = [train[0], [np.concatenate([a, b])[:11] for a, b in zip(train[0], train[1])]]  # 8 and 11 rows
    before = [_run(program, state, batch) for batch in batches]
    graph = program.graph_module.graph
    small_products(graph)
    assert _targets(graph).count(torch.ops.aten.addmm.default) == 1
    products = _targets(graph).count(torch.ops.aten.mm.default)

    assert unfuse_addmm(graph) == 1
    program.graph_module.recompile()
    assert torch.ops.aten.addmm.default not in _targets(graph)
    assert _targets(graph).count(torch.ops.aten.mm.default) == products + 1
    for batch, expected in zip(batches, before):
        for got, want in zip(_run(program, state, batch), expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert expected[0].item() > 0  # a real loss, not a zero graph


def test_a_scaled_or_float64_addmm_stays() -> None:
    def products(bias: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return torch.addmm(bias, a, b, beta=0.5), torch.addmm(bias.double(), a.double(), b.double())

    graph = make_fx(products)(torch.randn(3), torch.randn(2, 4), torch.randn(4, 3)).graph
    assert _targets(graph).count(torch.ops.aten.addmm.default) == 2
    assert unfuse_addmm(graph) == 0
