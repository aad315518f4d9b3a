"""Intra-op threads: the cores other processes leave free by default, a fixed count, or torch's count,
chosen by ``set_threads`` or the environment (``training/threads.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads
from ort_torch_train.cli.main import build_parser, main
from ort_torch_train.training import threads
from ort_torch_train.training.threads import THREADS_VARIABLE, threads_setting
from tests.helpers.paths import FIXTURES

MLP = FIXTURES / "mlp_ce_adamw_sched"
EXPECTED = "expected 'auto', 'torch' or an integer >= 1"


@pytest.fixture
def unchosen(restored_threads, monkeypatch):
    """A process that has not called set_threads, with no thread variable set (tests/conftest.py sets
    ORT_TORCH_TRAIN_THREADS): the policy is chosen from the environment at its first use."""
    monkeypatch.delenv(THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads._policy.setting = None


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
    with pytest.raises(ValueError, match=f"threads: {EXPECTED}"):
        set_threads(bad)


def test_without_a_pin_the_policy_is_auto(unchosen):
    torch.set_num_threads(2)
    assert threads_setting() == "auto" and torch.get_num_threads() == 2


@pytest.mark.parametrize(("text", "setting"), [("3", 3), ("1", 1), ("auto", "auto"), ("torch", "torch")])
def test_the_variable_pins_the_policy(unchosen, monkeypatch, text, setting):
    torch.set_num_threads(2)
    monkeypatch.setenv(THREADS_VARIABLE, text)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the library's own variable wins
    assert threads_setting() == setting
    assert torch.get_num_threads() == (setting if isinstance(setting, int) else 2)
    monkeypatch.setenv(THREADS_VARIABLE, "5")
    assert threads_setting() == setting  # read once


def test_omp_num_threads_leaves_torchs_count(unchosen, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # what OpenMP took from the variable when torch loaded it
    assert threads_setting() == "torch"
    threads.follow_load()
    assert torch.get_num_threads() == 1 and threads._policy.ceiling is None


@pytest.mark.parametrize("bad", ["two", "0", "-1", "1.5", "Auto"])
def test_a_bad_variable_is_refused_naming_it(unchosen, monkeypatch, bad):
    monkeypatch.setenv(THREADS_VARIABLE, bad)
    with pytest.raises(ValueError, match=f"^{THREADS_VARIABLE}: {EXPECTED}, got {bad!r}$"):
        threads_setting()


def test_torch_leaves_the_count_and_hands_back_what_auto_lowered(restored_threads):
    set_threads("auto")
    threads._policy.ceiling, threads._policy.applied = 2, 1  # auto lowered 2 threads to 1
    torch.set_num_threads(1)
    set_threads("torch")
    assert threads_setting() == "torch" and torch.get_num_threads() == 2
    torch.set_num_threads(1)  # the caller's count, kept
    threads._policy.next_check = 0.0
    threads.follow_load()
    assert torch.get_num_threads() == 1


def test_a_cpu_step_follows_the_load_by_default(unchosen):
    torch.set_num_threads(2)
    state = CheckpointState.load_checkpoint(MLP / "artifacts" / "checkpoint")
    module = Module(MLP / "artifacts" / "training_model.onnx", state)
    optimizer = Optimizer(MLP / "artifacts" / "optimizer_model.onnx", module)
    data = np.load(MLP / "data.npz")
    module(data["x_train"][0], data["y_train"][0])
    optimizer.step()
    assert threads_setting() == "auto"
    assert threads._policy.ceiling == 2  # the step's follow_load took torch's count as auto's ceiling


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


def test_the_cli_takes_a_thread_count_auto_or_torch(capsys):
    common = ["train", "artifacts", "--data", "data.npz", "--steps", "1"]
    assert build_parser().parse_args([*common, "--threads", "1"]).threads == 1
    assert build_parser().parse_args([*common, "--threads", "torch"]).threads == "torch"
    assert build_parser().parse_args(common).threads is None  # the library's default (default_threads)
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args([*common, "--threads", "0"])
    assert f"--threads: {EXPECTED}, got '0'" in capsys.readouterr().err


def test_the_cli_refuses_a_bad_variable_in_one_line(unchosen, monkeypatch, capsys):
    monkeypatch.setenv(THREADS_VARIABLE, "many")
    assert main(["train", str(MLP / "artifacts"), "--data", str(MLP / "data.npz"), "--steps", "1"]) == 1
    assert f"error: {THREADS_VARIABLE}: {EXPECTED}, got 'many'" in capsys.readouterr().err
