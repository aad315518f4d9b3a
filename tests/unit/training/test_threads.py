"""Intra-op threads: the cores other processes leave free by default, a fixed count, or torch's count,
chosen by ``set_threads`` or the environment (``training/threads.py``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads
from ort_torch_train.cli.common import CliError
from ort_torch_train.cli.main import build_parser, main
from ort_torch_train.cli.train_options import run_threads
from ort_torch_train.torch_internals import compile_counters
from ort_torch_train.training import threads
from ort_torch_train.training.threads import THREADS_VARIABLE, ThreadPolicy, process_threads, threads_setting
from tests.helpers.paths import FIXTURES, ROOT

MLP = FIXTURES / "mlp_ce_adamw_sched"
EXPECTED = "expected 'auto', 'torch' or an integer >= 1"
CPU = torch.device("cpu")
needs_proc_stat = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")


@pytest.fixture
def unchosen(restored_threads, monkeypatch) -> ThreadPolicy:
    """A process policy that no set_threads call chose, with no thread variable set (tests/conftest.py sets
    ORT_TORCH_TRAIN_THREADS): the environment chooses at its first use."""
    monkeypatch.delenv(THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    policy = ThreadPolicy()
    monkeypatch.setattr(threads, "_PROCESS_THREADS", policy)
    return policy


@pytest.fixture
def samples(monkeypatch) -> list[int]:
    """Counts the policy's reads of the machine's load."""
    counted: list[int] = []
    read = threads._busy_cpu_seconds
    monkeypatch.setattr(threads, "_busy_cpu_seconds", lambda cpus: counted.append(1) or read(cpus))
    return counted


@pytest.mark.parametrize(
    ("cpus", "other_busy", "ceiling", "expected"),
    [(2, 0.0, 2, 2), (2, 0.3, 2, 2), (2, 0.67, 2, 1), (2, 1.0, 2, 1), (2, 5.0, 2, 1), (8, 3.0, 8, 5), (4, 0.0, 2, 2)],
)
def test_auto_runs_on_the_cpus_others_leave_free(cpus, other_busy, ceiling, expected):
    assert threads.threads_for_load(cpus, other_busy, ceiling) == expected


def test_a_fixed_count_is_set_and_kept(restored_threads):
    set_threads(3)
    assert torch.get_num_threads() == 3 and threads_setting() == 3 and process_threads().setting() == 3
    process_threads().follow_load(CPU)
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
    assert unchosen.setting() == setting
    assert torch.get_num_threads() == (setting if isinstance(setting, int) else 2)
    monkeypatch.setenv(THREADS_VARIABLE, "5")
    assert unchosen.setting() == setting  # read once


def test_omp_num_threads_leaves_torchs_count(unchosen, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # what OpenMP took from the variable when torch loaded it
    assert unchosen.setting() == "torch"
    unchosen.follow_load(CPU)
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("bad", ["two", "0", "-1", "1.5", "Auto"])
def test_a_bad_variable_is_refused_naming_it(unchosen, monkeypatch, bad):
    monkeypatch.setenv(THREADS_VARIABLE, bad)
    with pytest.raises(ValueError, match=f"^{THREADS_VARIABLE}: {EXPECTED}, got {bad!r}$"):
        threads_setting()


@needs_proc_stat
def test_torch_leaves_the_count_and_hands_back_what_auto_lowered(restored_threads, monkeypatch):
    monkeypatch.setattr(threads, "threads_for_load", lambda cpus, other_busy, ceiling: 1)  # a busy machine
    torch.set_num_threads(2)
    policy = ThreadPolicy()
    policy.choose("auto")
    policy.follow_load(CPU)  # torch's count, 2, is auto's ceiling; too soon after the first sample to decide
    time.sleep(threads.MIN_WINDOW_S * 1.5)
    policy.follow_load(CPU)
    assert torch.get_num_threads() == 1
    policy.choose("torch")
    assert policy.setting() == "torch" and torch.get_num_threads() == 2
    torch.set_num_threads(1)  # the caller's count, kept
    policy.follow_load(CPU)
    assert torch.get_num_threads() == 1


def test_the_load_is_read_from_the_first_cpu_step_on(unchosen, samples):
    """A policy reads nothing until a CPU step follows the load; a step on another device reads nothing."""
    assert samples == []
    unchosen.follow_load(torch.device("meta"))
    unchosen.restart_load_window()  # no window started: nothing to restart
    assert samples == []
    unchosen.follow_load(CPU)
    assert len(samples) == 1 and unchosen.setting() == "auto"


def test_a_cpu_step_follows_the_load_by_default(unchosen, monkeypatch):
    torch.set_num_threads(2)
    devices = []
    follow = unchosen.follow_load
    monkeypatch.setattr(unchosen, "follow_load", lambda device: devices.append(device) or follow(device))
    state = CheckpointState.load_checkpoint(MLP / "artifacts" / "checkpoint")
    module = Module(MLP / "artifacts" / "training_model.onnx", state, MLP / "artifacts" / "eval_model.onnx")
    optimizer = Optimizer(MLP / "artifacts" / "optimizer_model.onnx", module)
    data = np.load(MLP / "data.npz")
    module(data["x_train"][0], data["y_train"][0])
    optimizer.step()
    module.eval()
    module(data["x_train"][0], data["y_train"][0])
    assert devices == [CPU, CPU] and threads_setting() == "auto"


_IMPORT = """
import builtins, io, sys
opened = []
real_open = io.open
def recording_open(file, *args, **kwargs):
    opened.append(str(file))
    return real_open(file, *args, **kwargs)
builtins.open = io.open = recording_open
import torch
threads = torch.get_num_threads()
import ort_torch_train.api
assert "/proc/stat" not in opened, "importing the package read /proc/stat"
assert torch.get_num_threads() == threads, (threads, torch.get_num_threads())
"""


@pytest.mark.slow
def test_importing_the_package_reads_no_load_and_sets_no_threads():
    env = {key: value for key, value in os.environ.items() if key != THREADS_VARIABLE}
    result = subprocess.run([sys.executable, "-c", _IMPORT], env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


@needs_proc_stat
def test_auto_leaves_a_busy_process_its_cpu(restored_threads):
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs 2 CPUs")
    policy = ThreadPolicy()
    policy.choose("auto")
    torch.set_num_threads(cpus)  # the ceiling auto starts from
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        policy.follow_load(CPU)  # too soon after the first sample to decide
        time.sleep(1.5)
        policy.follow_load(CPU)
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


@needs_proc_stat
@pytest.mark.compile
def test_a_compiled_step_keeps_the_count_it_was_compiled_at(unchosen, monkeypatch):
    """Under auto, a step compiled at 2 threads runs at 2 after the load lowered the count: another count
    would fail Dynamo's guards and compile the train step and the eval forward again."""
    torch._dynamo.reset()
    compile_counters().clear()
    torch.set_num_threads(2)
    wanted = [2]
    monkeypatch.setattr(threads, "threads_for_load", lambda cpus, other_busy, ceiling: wanted[0])
    state = CheckpointState.load_checkpoint(MLP / "artifacts" / "checkpoint")
    module = Module(
        MLP / "artifacts" / "training_model.onnx",
        state,
        MLP / "artifacts" / "eval_model.onnx",
        compile={"backend": "eager"},
        compile_cache=False,
    )
    optimizer = Optimizer(MLP / "artifacts" / "optimizer_model.onnx", module)
    data = np.load(MLP / "data.npz")
    batch = (data["x_train"][0], data["y_train"][0])

    def lowered_by_the_load() -> None:
        wanted[0] = 1
        time.sleep(threads.CHECK_INTERVAL_S * 1.2)
        unchosen.follow_load(CPU)  # an eager step of another Module, say
        assert torch.get_num_threads() == 1

    module.step(optimizer, *batch)
    module.eval()
    module(*batch)
    compiled = compile_counters()["stats"]["unique_graphs"]
    for _ in range(2):
        lowered_by_the_load()
        module.train()
        module.step(optimizer, *batch)
        assert torch.get_num_threads() == 2
        lowered_by_the_load()
        module.eval()
        module(*batch)
        assert torch.get_num_threads() == 2
    assert compile_counters()["stats"]["unique_graphs"] == compiled


@pytest.mark.parametrize(
    ("variables", "logged"),
    [
        ({}, "threads: auto, at most 2, fewer while other processes keep CPUs busy"),
        ({THREADS_VARIABLE: "3"}, f"threads: 3, fixed: CPU steps repeat bit for bit (${THREADS_VARIABLE}=3)"),
        (
            {"OMP_NUM_THREADS": "2"},
            "threads: torch's count, 2, fixed: CPU steps repeat bit for bit ($OMP_NUM_THREADS=2)",
        ),
    ],
)
def test_the_policy_in_effect_is_logged_once_at_its_first_use(unchosen, monkeypatch, caplog, variables, logged):
    torch.set_num_threads(2)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level("INFO", logger=threads.__name__):
        unchosen.setting()
        unchosen.setting()
    [message] = [record.getMessage() for record in caplog.records if record.name == threads.__name__]
    assert message.startswith(logged)
    assert message.endswith("(the default)") == (not variables)


def test_deterministic_runs_at_a_fixed_count(unchosen, monkeypatch):
    torch.set_num_threads(2)
    assert run_threads(None, False) == ("auto", "the default")
    assert run_threads(None, True) == (2, "--deterministic: torch's count")
    assert run_threads(3, True) == (3, "--deterministic, --threads 3")
    assert run_threads("torch", True) == (2, "--deterministic: torch's count")
    with pytest.raises(CliError, match="--deterministic fixes the thread count: --threads auto follows the load"):
        run_threads("auto", True)
    monkeypatch.setenv(THREADS_VARIABLE, "auto")
    assert run_threads(None, True) == (2, "--deterministic: torch's count")  # the option wins over the variable
    monkeypatch.setenv(THREADS_VARIABLE, "1")
    assert run_threads(None, True) == (1, f"--deterministic, ${THREADS_VARIABLE}=1")


def test_the_cli_logs_the_policy_at_start_with_v(unchosen, monkeypatch, caplog, tmp_path):
    torch.set_num_threads(2)
    monkeypatch.chdir(tmp_path)
    command = ["-v", "train", str(MLP / "artifacts"), "--data", str(MLP / "data.npz"), "--inputs", "x_train,y_train"]
    package = logging.getLogger("ort_torch_train")  # -v sets its level and adds a stderr handler: put back after
    level, handlers = package.level, list(package.handlers)
    try:
        with caplog.at_level("INFO", logger=threads.__name__):
            assert main([*command, "--batched", "--steps", "1", "--output", "run", "--deterministic"]) == 0
    finally:
        package.handlers = handlers
        package.setLevel(level)
    assert "threads: 2, fixed: CPU steps repeat bit for bit (--deterministic: torch's count)" in caplog.messages
    assert threads_setting() == 2
