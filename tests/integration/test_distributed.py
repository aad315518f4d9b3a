"""Data-parallel training on torch.distributed: 2 gloo ranks (distributed_worker.py) against 1 process.

Each launch runs two ranks with env:// rendezvous on a free port under a hard timeout; a stuck or
dead rank fails the test and every process is killed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.api import CheckpointState
from tests.helpers import distributed_worker as worker
from tests.helpers.ort_peer import requires_ort, run_ort
from tests.helpers.paths import ROOT
from tests.helpers.ports import free_port
from tests.helpers.rank_processes import run_ranks
from tests.helpers.timeouts import scaled

WORLD_SIZE = 2
TOLERANCE = 1e-6


def launch(
    scenario: str,
    out: Path,
    timeout: float,
    mpi: bool = False,
    worker_module: str = worker.__name__,
    world_size: int = WORLD_SIZE,
) -> list[subprocess.CompletedProcess]:
    """Run ``worker_module`` on ``world_size`` ranks (``rank_processes.run_ranks``), with torchrun's environment
    or (``mpi``) mpirun's; fail (after killing them all) when one is stuck past ``timeout``."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    environments = []
    for rank in range(world_size):
        ranks = (
            {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world_size)}
            if mpi
            else {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank)}
        )
        environments.append(
            {
                **environ,
                **ranks,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "ORT_TORCH_TRAIN_THREADS": "1",
            }
        )
    try:
        return run_ranks(worker_module, [scenario, str(out)], environments, ROOT, timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"distributed scenario {scenario!r}: a rank did not finish within {timeout} s")


def require_success(results: list[subprocess.CompletedProcess]) -> None:
    for rank, result in enumerate(results):
        assert result.returncode == 0, f"rank {rank} failed:\n{result.stderr[-4000:]}"


def rank_results(out: Path, run: str) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(out / f"{run}_rank{rank}.npz")) for rank in range(WORLD_SIZE)]


@pytest.fixture(scope="session")
def eager(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp_eager")
    worker.train("mlp_adamw_sched", save_at=(10, out / "one_process_step10.ckpt"))
    require_success(launch("eager", out, timeout=scaled(120)))
    return out


# The attention key bias has an exactly zero gradient (softmax ignores a constant shift): its float
# gradient is rounding noise (|g| < 2e-9, the other biases' ~1e-2) that differs entirely between a
# full batch and two half batches, and AdamW turns noise into steps of ~lr * |g| / eps. Those 16
# elements are checked against that bound (20 steps at lr <= 0.01: 1e-5), the others at TOLERANCE.
NOISE_ONLY = {"param/enc.self_attn.in_proj_bias": slice(16, 32)}
NOISE_TOLERANCE = 1e-5


def assert_same_training(out: Path, run: str, reference_run: str | None = None) -> None:
    """2 ranks on half batches == 1 process on the full batch (``reference_run``: the same training, run
    another way); the ranks agree bitwise."""
    reference = worker.train(reference_run or run)
    ranks = rank_results(out, run)
    for key in reference:
        if key.startswith("param/"):
            assert np.array_equal(ranks[0][key], ranks[1][key]), f"{run}: ranks differ on {key}"
            ours, theirs = ranks[0][key].copy(), reference[key].copy()
            if key in NOISE_ONLY:
                noise = NOISE_ONLY[key]
                np.testing.assert_allclose(ours[noise], theirs[noise], rtol=0, atol=NOISE_TOLERANCE, err_msg=key)
                ours[noise] = theirs[noise] = 0
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOLERANCE, err_msg=f"{run} {key}")
    mean_loss = (ranks[0]["losses"] + ranks[1]["losses"]) / 2  # mean losses: the full batch's is their mean
    np.testing.assert_allclose(mean_loss, reference["losses"], rtol=0, atol=TOLERANCE, err_msg=run)


@pytest.mark.distributed
@pytest.mark.parametrize("run", worker.SCENARIOS["eager"])
def test_two_ranks_train_like_one_process(eager: Path, run: str) -> None:
    assert_same_training(eager, run)


@pytest.mark.distributed
def test_sharded_state_holds_half_the_moments(eager: Path) -> None:
    """ZeRO-1, element-wise: each rank holds the moments of its half of the flattened parameters, even
    for the MLP whose first weight is 77% of it."""
    for run in ("transformer_sharded", "mlp_sharded_clip"):
        full = int(worker.train(run)["moment_bytes"])
        per_rank = [int(result["moment_bytes"]) for result in rank_results(eager, run)]
        assert sum(per_rank) == full
        assert max(per_rank) <= full / WORLD_SIZE + 8, (run, per_rank, full)


@pytest.mark.distributed
def test_rank0_checkpoint_continues_in_one_process(eager: Path) -> None:
    """The sharded run's rank-0 checkpoint (moments gathered) continues identically in 1 process."""
    path = eager / "mlp_sharded_clip.ckpt"
    reference = worker.train("mlp_sharded_clip")
    resumed = worker.train("mlp_sharded_clip", checkpoint=path, first_step=10)
    for key in reference:
        if key.startswith("param/"):
            np.testing.assert_allclose(resumed[key], reference[key], rtol=0, atol=TOLERANCE, err_msg=key)


@pytest.mark.distributed
@pytest.mark.parametrize("run", ["resumed", "resumed_sharded"])
def test_one_process_checkpoint_continues_on_two_ranks(eager: Path, run: str) -> None:
    """A 1-process step-10 checkpoint continues on 2 ranks (moments cut to slices with shard_state)."""
    reference = worker.train("mlp_adamw_sched")
    ranks = rank_results(eager, run)
    for key in reference:
        if key.startswith("param/"):
            np.testing.assert_allclose(ranks[0][key], reference[key], rtol=0, atol=TOLERANCE, err_msg=key)
            assert np.array_equal(ranks[0][key], ranks[1][key])


@pytest.mark.distributed
@pytest.mark.parametrize("run", ["legacy", "legacy_zero"])
def test_legacy_session_on_two_ranks_trains_like_one_process(eager: Path, run: str) -> None:
    """world_size=2 (and deepspeed_zero_stage=1: Adam's state sharded, gathered whole by
    get_optimizer_state) == the 1-process full-batch run."""
    reference = worker.legacy_train()
    ranks = rank_results(eager, run)
    for key in reference:
        if key.startswith(("param/", "moment/")):
            assert np.array_equal(ranks[0][key], ranks[1][key]), key
            np.testing.assert_allclose(ranks[0][key], reference[key], rtol=0, atol=TOLERANCE, err_msg=key)
    held = [int(result["held_moment_elements"]) for result in ranks]  # moment elements each rank keeps
    full = int(reference["held_moment_elements"])
    assert held == [full, full] if run == "legacy" else sum(held) == full and max(held) <= full / 2 + 2, held


@pytest.mark.distributed
def test_legacy_session_under_mpirun_environment_trains_like_one_process(tmp_path: Path) -> None:
    """mpirun's OMPI_COMM_WORLD_RANK/SIZE (no RANK/WORLD_SIZE): the legacy session initialises the
    process group itself and world_size=2 == the 1-process full-batch run."""
    require_success(launch("legacy_mpi", tmp_path, timeout=scaled(90), mpi=True))
    reference = worker.legacy_train()
    ranks = rank_results(tmp_path, "legacy_mpi")
    for key in reference:
        if key.startswith(("param/", "moment/")):
            assert np.array_equal(ranks[0][key], ranks[1][key]), key
            np.testing.assert_allclose(ranks[0][key], reference[key], rtol=0, atol=TOLERANCE, err_msg=key)


@pytest.mark.distributed
def test_fp16_overflow_on_one_rank_skips_the_step_on_all(eager: Path) -> None:
    """GradScaler semantics across ranks: the inf/nan flag is all-reduced, so both ranks skip step 2."""
    ranks = rank_results(eager, "fp16")
    for run in ("ddp", "sharded"):
        for result in ranks:
            assert result[f"{run}/skipped"].tolist() == [False, False, True, False], run
            assert float(result[f"{run}/scale"]) == 2.0**15, run
        for key in ranks[0]:
            assert np.array_equal(ranks[0][key], ranks[1][key]), f"ranks differ on {key}"
            if key.startswith("sharded/param/"):
                np.testing.assert_allclose(
                    ranks[0][key], ranks[0][key.replace("sharded", "ddp", 1)], rtol=0, atol=TOLERANCE, err_msg=key
                )


@pytest.mark.distributed
@pytest.mark.parametrize(
    "case, expected",
    [
        ("ddp_wrap", "distributed=True"),
        ("different_checkpoints", "same checkpoint"),
        ("shard_saved_alone", "but the parameter is"),
    ],
)
def test_misuse_raises_on_every_rank(eager: Path, case: str, expected: str) -> None:
    for rank in range(WORLD_SIZE):
        errors = json.loads((eager / f"errors_rank{rank}.json").read_text())
        assert expected in errors.get(case, ""), f"rank {rank}: {errors}"


@pytest.mark.distributed
def test_lost_rank_raises_within_the_timeout(tmp_path: Path) -> None:
    results = launch("lost_rank", tmp_path, timeout=scaled(60))
    require_success(results)
    assert "rank 0 of 2" in json.loads((tmp_path / "errors_rank0.json").read_text()).get("lost_rank", "")


@pytest.mark.distributed
@pytest.mark.ort_peer
@requires_ort[1]
def test_ort_loads_the_rank0_checkpoint(eager: Path) -> None:
    script = (
        "import sys, json\nfrom onnxruntime.training.api import CheckpointState\n"
        "s = CheckpointState.load_checkpoint(sys.argv[1])\n"
        "print(json.dumps({n: p.data.tolist() for n, p in s.parameters}))"
    )
    theirs = run_ort(script, eager / "mlp_sharded_clip.ckpt")
    ours = CheckpointState.load_checkpoint(eager / "mlp_sharded_clip.ckpt")
    for name, param in ours.parameters:
        np.testing.assert_array_equal(np.asarray(theirs[name], dtype=np.float32), param.data)


# the one-process references of the compiled runs: the same model, optimizer and steps trained eagerly
# (a compiled one process agrees with them far inside TOLERANCE, and costs a compilation in this process)
EAGER_REFERENCES = {"mlp_compiled": "mlp_adamw_sched", "mlp_compiled_sharded": "mlp_sharded_clip_6"}


@pytest.mark.distributed
@pytest.mark.compile
def test_compiled_steps_on_two_ranks_train_like_one_process_and_load_from_the_compile_cache(tmp_path: Path) -> None:
    """The first launch trains compiled (plain and sharded) like one eager process and saves the plain step
    in an empty compile cache; a second launch loads it on both ranks and trains bitwise alike."""
    require_success(launch("compiled", tmp_path, timeout=scaled(400)))
    for run in worker.SCENARIOS["compiled"]:
        assert_same_training(tmp_path, run, EAGER_REFERENCES[run])
    require_success(launch("compiled_cache", tmp_path, timeout=scaled(400)))
    cold, warm = (
        [dict(np.load(tmp_path / f"cached_compile_{launch}_rank{rank}.npz")) for rank in range(2)]
        for launch in ("cold", "warm")
    )
    for rank in range(2):
        assert not cold[rank]["found"] and cold[rank]["loaded"] == 0
        assert warm[rank]["found"] and warm[rank]["loaded"] >= 1, f"rank {rank} compiled the step again"
        for key in cold[rank]:
            if key.startswith("param/") or key == "losses":
                np.testing.assert_array_equal(warm[rank][key], cold[rank][key], err_msg=f"rank {rank} {key}")
    for key in warm[0]:
        if key.startswith("param/"):
            np.testing.assert_array_equal(warm[0][key], warm[1][key], err_msg=f"ranks differ on {key}")
