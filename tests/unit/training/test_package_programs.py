"""A package's programs as ``training/package/programs.py`` compiles them (issue 51, item 4): the mlp fixture's
train program, from the package the command line builds (shared with the other package tests), takes its
intermediate tensors from one pooled allocation per call instead of allocating each, and calls no ``addmm``
(``passes/unfused_addmm.py``)."""

from __future__ import annotations

import re

import pytest

from tests.helpers.packaged import fixture_package

CASE = "mlp_ce_adamw_sched"


def _train_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The train program's generated ``run_impl`` (C++)."""
    (wrapper,) = [
        path.read_text() for path in (fixture_package(tmp_path_factory, CASE) / "train_step").rglob("*.wrapper.cpp")
    ]
    return wrapper[wrapper.index("::run_impl(") :]


@pytest.mark.compile
@pytest.mark.slow
def test_train_program_carves_its_intermediates_from_one_pool(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = _train_run(tmp_path_factory)
    allocations = re.findall(r"aoti_torch_empty_strided\(", run)
    carved = re.findall(r"aoti_torch__alloc_from_pool\(", run)
    # one pool of the intermediates and the loss, its output (unpooled: the caller keeps it); the ~9 tensors the
    # step needs besides its inputs (activations, their gradients, the products' outputs) come from the pool
    assert len(allocations) <= 2, allocations
    assert len(carved) >= 8, len(carved)


@pytest.mark.compile
@pytest.mark.slow
def test_train_programs_first_layer_is_a_product_and_a_fused_add(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = _train_run(tmp_path_factory)
    # the first layer's forward product and its weight's gradient stay extern GEMMs (too large for small_products);
    # the forward's bias add is in a loop of the program's own, not torch's addmm copying the bias first
    assert re.findall(r"aoti_torch_cpu_(\w*mm)_out\(", run) == ["mm", "mm"]
