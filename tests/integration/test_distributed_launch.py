"""torchrun launches (``python -m torch.distributed.run``, 2 gloo processes): the ``train`` CLI and
examples/train_ddp.py train like one process on the whole batch; rank 0 alone reports and saves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.distributed.launch import LaunchEnvironment, backend_for
from ort_torch_train.state.training_state import TrainingState
from tests.helpers import distributed_worker as worker
from tests.helpers.paths import ROOT
from tests.helpers.ports import free_port
from tests.helpers.timeouts import scaled
from tests.integration.test_distributed import TOLERANCE
from tests.unit.cli.test_cli import run_cli


def torchrun(*args: object, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 ARGS`` on a free port; fails the test (killing every rank) past ``timeout``."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *map(str, args),
    ]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timeout = timeout or scaled(120)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun {args}: not finished within {timeout} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr[-4000:]
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def json_objects(text: str) -> list[dict]:
    """The JSON objects the ranks printed (their lines may reach the shared pipe run together)."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        value, at = decoder.raw_decode(text, at)
        objects.append(value)
    return objects


def assert_same_parameters(ours: Path, reference: dict[str, np.ndarray]) -> None:
    params = {name: tensor.numpy() for name, tensor in TrainingState.load(ours).state_dict().items()}
    for name, value in reference.items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=TOLERANCE, err_msg=name)


@pytest.mark.distributed
def test_train_cli_under_torchrun_trains_like_one_process(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    artifacts, data = worker.MLP / "artifacts", worker.MLP / "data.npz"
    common = [
        "train",
        artifacts,
        "--data",
        data,
        "--inputs",
        "x_train,y_train",
        "--batched",
        "--steps",
        6,
        "--lr",
        0.01,
        "--schedule",
        "linear",
        "--warmup",
        3,
        "--json",
    ]
    code, out, err = run_cli(capsys, *common, "--metrics", tmp_path / "one.jsonl", "--output", tmp_path / "one")
    assert code == 0, err
    assert json.loads(out)["last_step"] == 6
    launched = torchrun(
        "-m",
        "ort_torch_train",
        *common,
        "--shard-state",
        "--metrics",
        tmp_path / "two.jsonl",
        "--output",
        tmp_path / "two",
    )
    two = json.loads(launched.stdout)  # one summary: rank 0's
    assert two["world_size"] == 2 and two["last_step"] == 6
    lines = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    reference = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]  # written once, by rank 0
    np.testing.assert_allclose(
        [line["loss"] for line in lines], [line["loss"] for line in reference], rtol=0, atol=TOLERANCE
    )  # the mean of the ranks' losses: the whole batch's
    assert_same_parameters(
        tmp_path / "two", {n: t.numpy() for n, t in TrainingState.load(tmp_path / "one").state_dict().items()}
    )
    assert TrainingState.load(tmp_path / "two").optimizer.step == 6


@pytest.mark.parametrize("option", ["--shard-state", "--adasum"])
def test_train_cli_option_needs_a_launch(capsys: pytest.CaptureFixture, option: str) -> None:
    data = ["--data", worker.MLP / "data.npz", "--batched", "--inputs", "x_train,y_train"]
    code, _, err = run_cli(capsys, "train", worker.MLP / "artifacts", *data, "--steps", 1, option)
    assert code != 0 and option in err and "torchrun" in err


@pytest.mark.distributed
def test_train_ddp_example_trains_like_one_process(tmp_path: Path) -> None:
    launched = torchrun(
        ROOT / "examples" / "train_ddp.py", worker.MLP, "--steps", worker.STEPS, "--shard-state", "--out", tmp_path
    )
    summaries = sorted(json_objects(launched.stdout), key=lambda s: s["rank"])
    assert [s["world_size"] for s in summaries] == [2, 2] and summaries[1]["checkpoint"] is None
    reference = worker.train("mlp_adamw_sched")  # 1 process, whole batches, same schedule
    assert_same_parameters(
        tmp_path / "checkpoint", {k.removeprefix("param/"): v for k, v in reference.items() if k.startswith("param/")}
    )


@pytest.mark.distributed
def test_adasum_under_torchrun_keeps_the_ranks_identical(tmp_path: Path) -> None:
    torchrun(ROOT / "examples" / "train_ddp.py", worker.MLP, "--steps", 6, "--adasum", "--out", tmp_path / "example")
    common = ["train", worker.MLP / "artifacts", "--data", worker.MLP / "data.npz", "--batched"]
    common += ["--inputs", "x_train,y_train", "--steps", 4, "--batch-size", 64, "--adasum", "--json"]
    launched = torchrun("-m", "ort_torch_train", *common, "--output", tmp_path / "cli")
    assert json.loads(launched.stdout)["world_size"] == 2
    for run in (tmp_path / "example" / "checkpoint", tmp_path / "cli"):
        trained = TrainingState.load(run)
        initial = TrainingState.load(worker.MLP / "artifacts" / "checkpoint")
        assert trained.optimizer.step == (6 if run.name == "checkpoint" else 4)
        assert any(not torch.equal(trained.params[n], initial.params[n]) for n in initial.params)


def test_launch_environment_reads_torchrun_then_mpirun_variables() -> None:
    mpirun = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    environment = LaunchEnvironment.read({**mpirun, "MASTER_ADDR": "127.0.0.1"})
    assert (environment.rank, environment.world_size, environment.local_rank) == (1, 2, 1)
    assert environment.missing_rendezvous == ("MASTER_PORT",)
    torchrun_first = LaunchEnvironment.read({**mpirun, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    assert (torchrun_first.rank, torchrun_first.world_size, torchrun_first.local_rank) == (0, 4, 0)
    assert LaunchEnvironment.read({}) == LaunchEnvironment(None, None, None, ("MASTER_ADDR", "MASTER_PORT"))
    assert backend_for(torch.device("cpu")) == "gloo" and backend_for(torch.device("cuda", 0)) == "nccl"
