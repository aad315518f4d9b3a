"""Shared fixtures, and the markers every test gets from where it lives and what it runs.

A test that takes a ``corpus_case`` argument runs once per case directory (one holding
``expected.json``) under the shared refcorpus and under ``tests/fixtures``, as found at collection
time; with none present it is skipped.

Markers applied here: ``unit`` / ``parity`` / ``integration`` from the folder, ``cuda`` for a
parametrization on a CUDA device and ``compile`` for one with a true ``compile`` / ``compiled`` parameter.
Otherwise ``compile``, ``distributed``, ``ort_peer`` and ``slow`` are set on the tests themselves
(``tests.helpers.ort_peer.requires_ort`` carries ``ort_peer``).

Fixtures that several tests of a file share and that cost seconds (a two-rank launch, ONNX's node tests)
are session-scoped: pytest-xdist may interleave a file's tests with other files' on a worker, and a
module-scoped fixture would then be built again each time its file comes back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ort_torch_train.training.threads import THREADS_VARIABLE, set_threads, threads_setting
from tests.helpers.corpus import Case, corpus_cases
from tests.helpers.paths import FIXTURES, REFCORPUS

TESTS = Path(__file__).resolve().parent
# compiled tests compile: no test loads another's steps from the per-user compile cache unless it names one
os.environ["ORT_TORCH_TRAIN_CACHE_DIR"] = "off"
# the default thread policy, auto, follows the machine's load, and with it the last bits of a reduction:
# tests that compare runs bit for bit run on a fixed count, in this process (from its first tensor on)
# and in the processes it starts (tests/unit/training/test_threads.py tests the policies)
SUITE_THREADS = 2
# inductor compiles in this process and the ones it starts, without a pool of compile workers: the suite's
# two pytest workers already fill both cores, and each pool would cost its own torch import
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# ... and without its per-process check that g++ builds and loads each vector ISA the CPU lists (a g++ run per
# ISA in each new inductor cache dir, a library load in each process): the kernels are the ones the check
# would choose (tests/unit/test_suite_inductor.py compares the picks with and without it)
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
os.environ[THREADS_VARIABLE] = str(SUITE_THREADS)
set_threads(SUITE_THREADS)
FOLDER_MARKERS = ("unit", "parity", "integration")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "corpus_case" in metafunc.fixturenames:
        cases = corpus_cases()
        metafunc.parametrize("corpus_case", cases, ids=[f"{case.parent.name}/{case.name}" for case in cases])


def _on_cuda(item: pytest.Item) -> bool:
    """Whether one of the item's parameters names a CUDA device."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(
        str(value).startswith("cuda")
        for value in params.values()
        if isinstance(value, str) or type(value).__name__ == "device"
    )


def _compiles(item: pytest.Item) -> bool:
    """Whether the item is parametrized to compile (a true ``compile`` or ``compiled`` parameter)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(bool(params.get(name)) for name in ("compile", "compiled"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        if folder in FOLDER_MARKERS:
            item.add_marker(folder)
        if _on_cuda(item) and item.get_closest_marker("cuda") is None:
            item.add_marker("cuda")
        if _compiles(item) and item.get_closest_marker("compile") is None:
            item.add_marker("compile")


@pytest.fixture
def restored_threads() -> Iterator[None]:
    """The thread policy and torch's count put back as they were after the test."""
    setting, count = threads_setting(), torch.get_num_threads()
    yield
    set_threads(setting)
    torch.set_num_threads(count)


@pytest.fixture
def refcorpus() -> Path:
    """The shared reference corpus directory (skips the test when it is absent)."""
    if not REFCORPUS.is_dir():
        pytest.skip(f"reference corpus not found at {REFCORPUS}")
    return REFCORPUS


@pytest.fixture
def case(corpus_case: Path) -> Case:
    """The reference case behind ``corpus_case``."""
    return Case(corpus_case)


@pytest.fixture
def mlp_case() -> Case:
    """An MLP + CrossEntropy + AdamW case with a nominal checkpoint (fixture, else refcorpus)."""
    for root in (FIXTURES / "mlp_ce_adamw_sched", REFCORPUS / "mlp"):
        if (root / "expected.json").is_file():
            return Case(root)
    pytest.skip("no MLP reference case present")
