"""Tiny models that would be unbounded when converted naively stay bounded: a long Scan and nested Loops
run as run-time loops past the unrolling budget; an op sized past this machine's memory is refused at once.
Each bomb runs in a subprocess under a memory cap (tests/helpers/graph_bombs.py) and a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.graph_bombs import NESTED_TRIPS, SCAN_STEPS
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

pytestmark = pytest.mark.slow  # a subprocess each (a few seconds)
SIZE_OPS = ("Expand", "Tile", "ConstantOfShape", "Range")


def _bombs(*names: str) -> dict:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "ORT_TORCH_TRAIN_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    process = subprocess.run(
        [sys.executable, "-m", "tests.helpers.graph_bombs", *names],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=ROOT,
        env=environment,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    return json.loads(process.stdout.splitlines()[-1])


def test_a_long_scan_runs_as_a_run_time_loop() -> None:
    outcome = _bombs("scan")["scan"]
    assert outcome["outputs"] == [SCAN_STEPS, SCAN_STEPS]  # final state, last running sum
    assert outcome["run_time_loops"] == 1 and outcome["graph_nodes"] < 50


def test_nested_loops_unroll_within_the_work_budget_and_run_the_rest_at_run_time() -> None:
    outcome = _bombs("nested_loops")["nested_loops"]
    assert outcome["outputs"] == [NESTED_TRIPS**3]
    assert outcome["run_time_loops"] >= 1


def test_an_output_larger_than_memory_is_refused_at_once() -> None:
    for op, outcome in _bombs(*SIZE_OPS).items():
        assert outcome["error"] == "GraphSizeError", (op, outcome)
        assert f"{op}: an output of shape" in outcome["message"] and "1099511627776 elements" in outcome["message"]
        assert outcome["seconds"] < 5
