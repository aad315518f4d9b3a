"""A package's programs as ``training/package/programs.py`` compiles them (issue 51, item 4): the mlp fixture's
train program, from the package the command line builds (shared with the other package tests), takes its
intermediate tensors from one pooled allocation per call instead of allocating each."""

from __future__ import annotations

import re
import zipfile

import pytest

from tests.helpers.packaged import fixture_package

CASE = "mlp_ce_adamw_sched"


@pytest.mark.compile
@pytest.mark.slow
def test_train_program_carves_its_intermediates_from_one_pool(tmp_path_factory: pytest.TempPathFactory) -> None:
    with zipfile.ZipFile(fixture_package(tmp_path_factory, CASE) / "train_step.pt2") as archive:
        (wrapper,) = [archive.read(name).decode() for name in archive.namelist() if name.endswith("wrapper.cpp")]
    run = wrapper[wrapper.index("::run_impl(") :]
    allocations = re.findall(r"aoti_torch_empty_strided\(", run)
    carved = re.findall(r"aoti_torch__alloc_from_pool\(", run)
    # one pool of the intermediates and the loss, its output (unpooled: the caller keeps it); the ~9 tensors the
    # step needs besides its inputs (activations, their gradients, the products' outputs) come from the pool
    assert len(allocations) <= 2, allocations
    assert len(carved) >= 8, len(carved)
