"""Every figure in docs/performance.md is backed: each paragraph, list or table that holds a measured
figure follows (in its section) a citation of an existing ``bench/results/`` file, or its section is
marked unverified; every result file the README and the docs name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

PERFORMANCE = ROOT / "docs" / "performance.md"
RESULT_FILE = re.compile(r"bench/results/[\w.-]+\.(?:md|png|json)")
UNVERIFIED = "**Unverified: no result file.**"
# a measured figure: a time, a size, a ratio or a share (not "8 x 32" shapes, versions or dates)
FIGURE = re.compile(r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:x\b|%|\s?(?:us|ms|s|MB|GB|GFLOPS)\b)")


def uncited_figures(text: str) -> list[str]:
    """The figure-bearing lines of a page that no citation (or unverified mark) before them in their
    section covers, and the result files named that do not exist."""
    problems = []
    for section in re.split(r"^(?=## )", text, flags=re.MULTILINE):
        covered = False
        for block in re.split(r"\n\s*\n", section):
            named = RESULT_FILE.findall(block)
            problems += [f"missing result file: {name}" for name in named if not (ROOT / name).is_file()]
            covered = covered or bool(named) or UNVERIFIED in block
            if not covered:
                problems += [line for line in block.splitlines() if FIGURE.search(line)]
    return problems


def test_every_figure_in_performance_md_cites_a_result_file() -> None:
    assert uncited_figures(PERFORMANCE.read_text()) == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_result_files_named_exist(page: Path) -> None:
    missing = [name for name in RESULT_FILE.findall(page.read_text()) if not (ROOT / name).is_file()]
    assert missing == []


def test_the_check_finds_uncited_and_missing() -> None:
    text = (
        "## A\n\nThe step takes 12 ms.\n\n"
        "## B\n\n`run.py`; `bench/results/20261124-005842-cpu.md`.\n\n| model | step |\n|---|---|\n| mlp | 48 us |\n\n"
        "## C\n\n" + UNVERIFIED + "\n\n| 0.5x |\n\n"
        "## D\n\n`bench/results/19990101-000000-cpu.md`: 3.2x faster, a 8 x 32 batch on 2026-11-25.\n"
    )
    assert uncited_figures(text) == [
        "The step takes 12 ms.",
        "missing result file: bench/results/19990101-000000-cpu.md",
    ]
