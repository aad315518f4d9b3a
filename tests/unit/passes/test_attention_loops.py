"""The package programs' attention rewrites on the tinyformer's train step, exported with its batch dynamic as
``ort-torch-train package`` exports it: CPU flash attention's forward and backward as products and sums
(``passes/attention_loops.py``) and the heads' reshapes refined so that no axis merges the batch with the heads
(``passes/refined_reshapes.py``). The step's loss and gradients hold to float32 rounding at several batch sizes,
batch 1 among them."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch
from torch import Tensor

from ort_torch_train.passes.attention_loops import attention_loops
from ort_torch_train.passes.refined_reshapes import refined_reshapes
from tests.helpers.exported_steps import exported_train_step
from tests.helpers.fixture_runs import fixture_batches

CASE = "transformer"  # one encoder layer: 6 positions, 2 heads of 8 values, batch dynamic
FLASH = (
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
)
RESHAPES = (torch.ops.aten.reshape.default, torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


@pytest.fixture(scope="module")
def train_step() -> tuple[torch.export.ExportedProgram, list[Tensor], int]:
    return exported_train_step(CASE)


def _run(program: torch.export.ExportedProgram, state: list[Tensor], batch: list[np.ndarray]) -> list[Tensor]:
    """The step's outputs and the gradients it writes, on fresh copies of ``state``."""
    arguments = [torch.from_numpy(array) for array in batch] + [tensor.clone() for tensor in state]
    outputs = program.module()(*arguments)
    return [*outputs, *arguments[len(batch) : -1]]


def _batches() -> list[list[np.ndarray]]:
    """The fixture's first batch (8 rows), its first row, and 11 rows of its first two."""
    train, _ = fixture_batches(CASE, 2)
    return [train[0], [array[:1] for array in train[0]], [np.concatenate([a, b])[:11] for a, b in zip(*train[:2])]]


def _merged_head_axes(program: torch.export.ExportedProgram) -> list[str]:
    """The reshapes' extents that are a multiple of the batch other than its 6 tokens (the batch times the heads)."""
    merged = []
    for node in program.graph.nodes:
        if node.target in RESHAPES:
            for extent in node.meta["val"].shape:
                if isinstance(extent, torch.SymInt):
                    coefficient, _ = extent.node.expr.as_coeff_Mul()
                    if coefficient not in (sympy.Integer(1), sympy.Integer(6)):
                        merged.append(str(extent))
    return merged


def test_attention_and_head_views_rewritten_and_results_hold(train_step) -> None:
    program, state, _ = train_step
    batches = _batches()
    before = [_run(program, state, batch) for batch in batches]
    assert sum(node.target in FLASH for node in program.graph.nodes) == 2
    assert _merged_head_axes(program)  # the batch times the heads: what the refinement removes

    assert attention_loops(program.graph_module.graph) == 2
    assert refined_reshapes(program.graph_module.graph) > 0
    program.graph_module.recompile()
    assert not any(node.target in FLASH for node in program.graph.nodes)
    assert _merged_head_axes(program) == []
    assert attention_loops(program.graph_module.graph) == refined_reshapes(program.graph_module.graph) == 0

    for batch, expected in zip(batches, before):
        got = _run(program, state, batch)
        assert len(got) == len(expected) and expected[0].item() > 0  # a real loss
        for value, want in zip(got, expected):
            torch.testing.assert_close(value, want, rtol=0, atol=1e-6)
        assert any(gradient.abs().max() > 0 for gradient in got[-len(state) + 1 :])  # gradients were written
