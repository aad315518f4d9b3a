"""Saves and start-up checks of a data-parallel run on 2 gloo ranks (issue 29): the rank-0-only save
idiom, per-rank save paths, a rank dying during a save, ranks with different optimizer settings."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.api import CheckpointState
from tests.helpers import distributed_save_worker
from tests.helpers.dist_grouped_launch import grouped_launch
from tests.helpers.timeouts import scaled
from tests.integration.test_distributed import WORLD_SIZE, launch

pytestmark = pytest.mark.distributed


def outcomes(out: Path) -> list[dict[str, str]]:
    return [json.loads((out / f"outcomes_rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


@pytest.fixture(scope="session")
def saves(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's one launch of the "saves" scenario, for every pytest-xdist worker (``dist_grouped_launch``)."""

    def launch_saves(scenarios: list[str], out: Path) -> list[subprocess.CompletedProcess]:
        return launch(",".join(scenarios), out, timeout=scaled(90), worker_module=distributed_save_worker.__name__)

    return grouped_launch(tmp_path_factory, "trust_saves", ["saves"], WORLD_SIZE, launch_saves).folder("saves")


def test_rank0_only_save_and_per_rank_paths_are_written(saves: Path) -> None:
    tmp_path, ranks = saves, outcomes(saves)
    assert ranks[0]["rank0_only"] == "ok" and "rank0_only" not in ranks[1]
    for result in ranks:
        for case in ("steps_after", "per_rank", "shared", "sharded_steps_after", "sharded_per_rank"):
            assert result[case] == "ok", (case, result)
    params = dict(np.load(tmp_path / "params_rank0.npz"))
    for name in ("rank0.ckpt", "rank1.ckpt", "shared.ckpt"):
        saved = CheckpointState.load_checkpoint(tmp_path / name)
        assert saved.training_state.optimizer.step == 3
        for key, value in params.items():
            np.testing.assert_array_equal(saved.parameters[key].data, value, err_msg=f"{name} {key}")
    assert CheckpointState.load_checkpoint(tmp_path / "rank0_only.ckpt").training_state.optimizer.step == 1
    for name in ("sharded_rank0.ckpt", "sharded_rank1.ckpt"):  # whole moments, gathered
        saved = CheckpointState.load_checkpoint(tmp_path / name).training_state
        for param, moments in saved.optimizer.momentums.items():
            assert all(moment.shape == saved.params[param].shape for moment in moments.values())
    error = ranks[0]["sharded_rank0_only"]
    assert error.startswith("DistributedError") and "every rank must call save_checkpoint" in error, error
    assert not (tmp_path / "sharded_rank0_only.ckpt").exists()


def test_a_save_inside_a_step_is_refused_on_every_rank(saves: Path) -> None:
    for rank, result in enumerate(outcomes(saves)):
        assert result["inside_step"].startswith("DistributedError") and "Preemption" in result["inside_step"], rank
    assert not (saves / "inside.ckpt").exists()


def test_ranks_with_different_optimizer_state_or_learning_rate_are_refused(saves: Path) -> None:
    for rank, result in enumerate(outcomes(saves)):
        assert result["different_moments"].startswith("DistributedError"), (rank, result)
        assert "different optimizer state" in result["different_moments"]
        assert ("['moments'] differ" in result["different_moments"]) == (rank == 1), (rank, result)
        assert result["different_learning_rate"].startswith("DistributedError"), (rank, result)
        assert "different learning rates" in result["different_learning_rate"]
        assert result["same_settings"] == "ok", (rank, result)


def test_a_rank_dying_during_a_save_raises_the_projects_error(tmp_path: Path) -> None:
    results = launch("lost_saver", tmp_path, timeout=scaled(90), worker_module=distributed_save_worker.__name__)
    assert results[0].returncode == 17, results[0].stderr[-3000:]
    assert results[1].returncode == 0, results[1].stderr[-3000:]
    error = json.loads((tmp_path / "outcomes_rank1.json").read_text())["lost_saver"]
    assert error.startswith("DistributedError") and "rank 1 of 2" in error and "died or timed out" in error, error
