"""Shared test fixtures: where the reference corpus lives, and the corpus cases to parametrize over.

A test that takes a ``corpus_case`` argument runs once per case directory (one holding
``expected.json``) under the shared refcorpus and under ``tests/fixtures``, as found at collection
time; with none present it is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REFCORPUS = Path(__file__).resolve().parents[2] / "shared" / "refcorpus"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def corpus_cases() -> list[Path]:
    """Every case directory of the refcorpus and of tests/fixtures."""
    return [
        case
        for root in (REFCORPUS, FIXTURES)
        if root.is_dir()
        for case in sorted(root.iterdir())
        if (case / "expected.json").is_file()
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "corpus_case" in metafunc.fixturenames:
        cases = corpus_cases()
        metafunc.parametrize("corpus_case", cases, ids=[f"{case.parent.name}/{case.name}" for case in cases])


@pytest.fixture
def refcorpus() -> Path:
    """The shared reference corpus directory (skips the test when it is absent)."""
    if not REFCORPUS.is_dir():
        pytest.skip(f"reference corpus not found at {REFCORPUS}")
    return REFCORPUS


@pytest.fixture
def case(corpus_case: Path):
    """The reference case behind ``corpus_case``."""
    from corpus import Case

    return Case(corpus_case)


@pytest.fixture
def mlp_case():
    """An MLP + CrossEntropy + AdamW case with a nominal checkpoint (fixture, else refcorpus)."""
    from corpus import Case

    for root in (FIXTURES / "mlp_ce_adamw_sched", REFCORPUS / "mlp"):
        if (root / "expected.json").is_file():
            return Case(root)
    pytest.skip("no MLP reference case present")
