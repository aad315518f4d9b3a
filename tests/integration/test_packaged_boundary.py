"""Every entry point of the runtime with no Python (issue 51, item 2) called with NULLs, handles in the wrong state,
released, foreign and unknown handles of every kind and bad sizes comes back as a status, and the run goes on to
train, export and run its export (tests/native/packaged_boundary.c). The same program under valgrind:
bench/experiments/packaged_leaks.py (minutes: it compiles a package valgrind can run, without AVX-512)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers.native import MLP, PROGRAMS
from tests.helpers.packaged import fixture_package, packaged_program
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

pytestmark = [pytest.mark.compile, pytest.mark.slow]
HEADER = ROOT / "ort_torch_train" / "native" / "include" / "ort_torch_train_training_c_api.h"
BAD_CALLS = 124  # the calls packaged_boundary.c makes that must come back as statuses (43 with bad handles)


def _training_members() -> set[str]:
    struct = HEADER.read_text().split("struct OrtTrainingApi {", 1)[1].split("};", 1)[0]
    return set(re.findall(r"\(\*(\w+)\)\(", struct))


def test_every_entry_point_refuses_bad_calls_with_a_status_and_then_works(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    package = fixture_package(tmp_path_factory, "mlp_ce_adamw_sched")
    program = packaged_program(tmp_path_factory, PROGRAMS / "packaged_boundary.c")
    arguments = [str(program), str(package), str(MLP / "checkpoint"), str(tmp_path), "logits", str(MLP)]
    environment = {**os.environ, "ORT_TORCH_TRAIN_PACKAGE": str(package)}
    done = subprocess.run(arguments, capture_output=True, text=True, env=environment, timeout=scaled(300))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    called = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("called ")}
    assert called == _training_members()
    assert done.stdout.splitlines()[-2:] == [f"bad: {BAD_CALLS}", "done"]
    # the saved checkpoint cut at every length and with each byte inverted: every cut past its padding is refused
    damaged = next(line for line in done.stdout.splitlines() if line.startswith("damaged checkpoints: "))
    refused, tried = (int(number) for number in re.findall(r"\d+", damaged))
    size = (tmp_path / "checkpoint").stat().st_size
    assert tried == 2 * size and size - 8 <= refused < tried, damaged
    assert (tmp_path / "checkpoint").stat().st_size > 0 and (tmp_path / "inference.onnx").stat().st_size > 0
