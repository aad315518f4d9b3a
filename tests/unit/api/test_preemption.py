"""SIGTERM -> save_checkpoint from the signal handler, in the middle of training: every checkpoint
written holds the parameters, moments and step of one step (issue 29)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import preemption_worker
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled


@pytest.mark.slow
def test_saves_from_a_sigterm_handler_hold_one_step(tmp_path: Path) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", preemption_worker.__name__, str(tmp_path), "60"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "ORT_TORCH_TRAIN_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + scaled(60)
        while not (tmp_path / "ready").exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        while worker.poll() is None and time.monotonic() < deadline:
            os.kill(worker.pid, signal.SIGTERM)
            time.sleep(0.02)
        _, stderr = worker.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert worker.returncode == 0, stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["saved"] >= 5, report  # how many depends on the machine's load: each is checked
    assert report["inconsistent"] == [], report
