"""The runtime with no Python under valgrind (issue 51, item 2): every entry point called with NULLs, handles in the
wrong state and bad sizes comes back as a status, and the whole run (two train steps, an export and its inference)
loses no block the runtime allocated and makes no invalid read or write (bench/experiments/packaged_leaks.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.native import PROGRAMS
from tests.helpers.packaged import fixture_package, packaged_program
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

pytestmark = [pytest.mark.compile, pytest.mark.slow]
HEADER = ROOT / "ort_torch_train" / "native" / "include" / "ort_torch_train_training_c_api.h"


def _bench() -> object:
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
    try:
        import packaged_leaks
    finally:
        sys.path.pop(0)
    return packaged_leaks


def _training_members() -> set[str]:
    struct = HEADER.read_text().split("struct OrtTrainingApi {", 1)[1].split("};", 1)[0]
    return set(re.findall(r"\(\*(\w+)\)\(", struct))


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_every_entry_point_under_valgrind_loses_nothing_and_reads_nothing_it_does_not_own(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    leaks = _bench()
    package = fixture_package(tmp_path_factory, "mlp_ce_adamw_sched")
    program = packaged_program(tmp_path_factory, PROGRAMS / "packaged_boundary.c")
    log = tmp_path / "valgrind.log"
    try:
        done = leaks.run(program, package, tmp_path, "logits", log, scaled(600))  # type: ignore[attr-defined]
    except subprocess.TimeoutExpired:
        pytest.fail("valgrind did not finish in time")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    called = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("called ")}
    assert called == _training_members()
    assert int(done.stdout.split("bad: ")[1].split()[0]) >= 80
    found = leaks.analyse(log.read_text())  # type: ignore[attr-defined]
    lost = found["runtime_lost_bytes"]
    assert lost["definitely"] == 0 and lost["indirectly"] == 0, found["runtime_records"]
    assert found["invalid_accesses"] == [], found["invalid_accesses"]
