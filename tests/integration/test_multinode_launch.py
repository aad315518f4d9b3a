"""Two simulated nodes on this machine: two torchrun launchers, one process each, meeting over c10d's
rendezvous on loopback, as on two machines (``torchrun --nnodes=2 --rdzv-backend=c10d
--rdzv-endpoint=HOST:PORT``, or the static ``--node-rank``/``--master-addr`` one): they train like one
process (with ZeRO-1 or ZeRO-3 sharding), rank 0's checkpoint loads in ORT, and a node lost mid-run
fails the other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.state.training_state import TrainingState
from tests.helpers import distributed_worker as worker
from tests.helpers.ort_peer import ORT_PYTHON, run_ort
from tests.helpers.paths import ROOT
from tests.helpers.ports import free_port
from tests.helpers.timeouts import scaled
from tests.integration.test_distributed import TOLERANCE
from tests.unit.cli.test_cli import run_cli

TRAIN = ["train", worker.MLP / "artifacts", "--data", worker.MLP / "data.npz", "--inputs", "x_train,y_train"]
TRAIN += ["--batched", "--lr", "0.01", "--json"]


def start_nodes(tmp_path: Path, *args: object, static: bool = False) -> list[subprocess.Popen]:
    """Two launchers of ``ort-torch-train ARGS`` (``--output`` and ``--metrics`` per node added), each
    its own session, as on two machines; ``static``: torchrun's static rendezvous (``--node-rank`` 0 and 1
    meeting at node 0's ``--master-addr``/``--master-port``) instead of c10d's."""
    endpoint, job = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    nodes = []
    for node in range(2):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
        if static:
            address, port = endpoint.split(":")
            command += [f"--node-rank={node}", f"--master-addr={address}", f"--master-port={port}"]
        else:
            command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job}"]
        command += ["--max-restarts=0"]
        command += ["-m", "ort_torch_train", *map(str, args)]
        command += ["--output", str(tmp_path / f"node{node}"), "--metrics", str(tmp_path / f"node{node}.jsonl")]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with (tmp_path / f"node{node}.log").open("w") as log:
            nodes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True))
    return nodes


def kill_node(node: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process under it (the machine is gone)."""
    pids, pending = [], [node.pid]
    while pending:
        pid = pending.pop()
        pids.append(pid)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        pending += [int(child) for child in children]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    node.wait()


def wait_all(nodes: list[subprocess.Popen], tmp_path: Path, timeout: float) -> list[int]:
    """The launchers' exit statuses; fails the test (killing them) when one is still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    try:
        return [node.wait(timeout=max(0.0, deadline - time.monotonic())) for node in nodes]
    except subprocess.TimeoutExpired:
        logs = "\n".join((tmp_path / f"node{i}.log").read_text()[-2000:] for i in range(len(nodes)))
        pytest.fail(f"a launcher is still running after {timeout} s:\n{logs}")
    finally:
        for node in nodes:
            if node.poll() is None:
                kill_node(node)


@pytest.mark.distributed
@pytest.mark.slow
def test_two_nodes_train_like_one_process_and_ort_loads_the_rank0_checkpoint(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, *TRAIN, "--steps", 6, "--output", tmp_path / "one")
    assert code == 0, err
    nodes = start_nodes(tmp_path, *TRAIN, "--steps", 6, "--shard-state")
    assert wait_all(nodes, tmp_path, timeout=scaled(120)) == [0, 0]
    # each node names its own --output (its own disk), so each rank writes its own copy: the same bytes
    saved = [tmp_path / f"node{node}" for node in range(2)]
    assert saved[0].read_bytes() == saved[1].read_bytes()
    reference = TrainingState.load(tmp_path / "one").state_dict()
    trained = TrainingState.load(saved[0])
    assert trained.optimizer is not None and trained.optimizer.step == 6
    for name, value in trained.state_dict().items():
        np.testing.assert_allclose(value.numpy(), reference[name].numpy(), rtol=0, atol=TOLERANCE, err_msg=name)
    if not ORT_PYTHON.exists():
        pytest.skip(f"no onnxruntime-training python at {ORT_PYTHON}")
    script = (
        "import sys, json\nfrom onnxruntime.training.api import CheckpointState, Module, Optimizer\n"
        "s = CheckpointState.load_checkpoint(sys.argv[1])\n"
        "m = Module(sys.argv[2] + '/training_model.onnx', s, sys.argv[2] + '/eval_model.onnx')\n"
        "Optimizer(sys.argv[2] + '/optimizer_model.onnx', m)\n"
        "print(json.dumps({n: p.data.tolist() for n, p in s.parameters}))"
    )
    theirs = run_ort(script, saved[0], worker.MLP / "artifacts")
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(np.asarray(theirs[name], dtype=np.float32), value.numpy(), err_msg=name)


@pytest.mark.distributed
@pytest.mark.slow
def test_two_nodes_with_zero3_sharding_train_like_one_process(capsys, tmp_path: Path) -> None:
    """``torchrun --nnodes=2 --node-rank=0|1`` over loopback, ``train --sharding zero3``: each node's rank
    feeds half of every batch and holds half of each parameter, gradient and moment; the checkpoint
    (gathered, written by rank 0) holds one process's parameters and moments after the same steps."""
    code, _, err = run_cli(capsys, *TRAIN, "--steps", 4, "--output", tmp_path / "one")
    assert code == 0, err
    nodes = start_nodes(tmp_path, *TRAIN, "--steps", 4, "--sharding", "zero3", static=True)
    assert wait_all(nodes, tmp_path, timeout=scaled(120)) == [0, 0]
    reference = TrainingState.load(tmp_path / "one").state_dict()
    trained = TrainingState.load(tmp_path / "node0")
    assert trained.optimizer is not None and trained.optimizer.step == 4
    assert trained.state_dict().keys() == reference.keys()
    for name, value in trained.state_dict().items():
        np.testing.assert_allclose(value.numpy(), reference[name].numpy(), rtol=0, atol=TOLERANCE, err_msg=name)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_node_lost_mid_run_fails_the_other(tmp_path: Path) -> None:
    """Killing one launcher and its process (SIGKILL: the machine is gone) while both train makes the
    other's step fail on the broken connection, and its launcher exit non-zero, within a minute."""
    nodes = start_nodes(tmp_path, *TRAIN, "--steps", 1_000_000)
    deadline = time.monotonic() + scaled(120)
    while not any((tmp_path / f"node{node}.jsonl").exists() for node in range(2)):  # rank 0 trains
        assert time.monotonic() < deadline and all(node.poll() is None for node in nodes), "no node started training"
        time.sleep(0.2)
    kill_node(nodes[1])
    [status] = wait_all(nodes[:1], tmp_path, timeout=scaled(60))
    assert status != 0 and "ort-torch-train: error:" in (tmp_path / "node0.log").read_text()
