"""Intra-op threads: a fixed count, or the cores other processes leave free (``training/threads.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from ort_torch_train.api import set_threads
from ort_torch_train.cli.main import build_parser
from ort_torch_train.training import threads


@pytest.fixture
def restored_threads():
    before = torch.get_num_threads()
    yield
    set_threads("auto")
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("cpus", "other_busy", "ceiling", "expected"),
    [(2, 0.0, 2, 2), (2, 0.3, 2, 2), (2, 0.67, 2, 1), (2, 1.0, 2, 1), (2, 5.0, 2, 1), (8, 3.0, 8, 5), (4, 0.0, 2, 2)],
)
def test_auto_runs_on_the_cpus_others_leave_free(cpus, other_busy, ceiling, expected):
    assert threads.threads_for_load(cpus, other_busy, ceiling) == expected


def test_a_fixed_count_is_set_and_kept(restored_threads):
    set_threads(3)
    assert torch.get_num_threads() == 3 and threads.threads_setting() == 3
    threads._policy.next_check = 0.0
    threads.follow_load()
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("bad", [0, -1, "two", True, 1.5])
def test_a_bad_count_is_refused(bad):
    with pytest.raises(ValueError, match="threads: expected 'auto' or an integer >= 1"):
        set_threads(bad)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_auto_leaves_a_busy_process_its_cpu(restored_threads):
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs 2 CPUs")
    set_threads("auto")
    torch.set_num_threads(cpus)  # the ceiling auto starts from
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        threads.follow_load()  # the first sample
        time.sleep(1.5)
        threads._policy.next_check = 0.0
        threads.follow_load()
    finally:
        busy.kill()
        busy.wait()
    assert 1 <= torch.get_num_threads() <= cpus - 1


def test_the_cli_takes_a_thread_count_or_auto(capsys, monkeypatch):
    common = ["train", "artifacts", "--data", "data.npz", "--steps", "1"]
    assert build_parser().parse_args([*common, "--threads", "1"]).threads == 1
    monkeypatch.delenv("ORT_TORCH_TRAIN_THREADS")  # tests/conftest.py fixes it
    assert build_parser().parse_args(common).threads == "auto"
    monkeypatch.setenv("ORT_TORCH_TRAIN_THREADS", "3")
    assert build_parser().parse_args(common).threads == 3
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args([*common, "--threads", "0"])
