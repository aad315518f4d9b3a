"""One rank of tests/integration/test_distributed_trust.py: saves and start-up checks on 2 gloo ranks.

``python -m tests.helpers.distributed_save_worker SCENARIO OUT_DIR`` with torchrun's env (SCENARIO:
"saves", or "lost_saver" where rank 0 dies). Each rank
writes ``OUT_DIR/outcomes_rank<r>.json`` ("saves" marked done: ``dist_rank_scenarios``): what each case did ("ok" or the error's type and text).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch.distributed as dist

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.fileio import path_lock
from tests.helpers.dist_rank_scenarios import run_scenarios
from tests.helpers.distributed_worker import MLP, batches, part
from tests.helpers.timeouts import scaled

ARTIFACTS = MLP / "artifacts"


def attempt(outcomes: dict[str, str], case: str, action: Callable[[], object]) -> None:
    """Run ``action``, recording "ok" or the error it raised."""
    try:
        action()
        outcomes[case] = "ok"
    except Exception as error:
        outcomes[case] = f"{type(error).__name__}: {error}"


def trainer(rank: int, checkpoint: Path | None = None, shard_state: bool = False) -> tuple:
    state = CheckpointState.load_checkpoint(checkpoint or ARTIFACTS / "checkpoint")
    module = Module(ARTIFACTS / "training_model.onnx", state, distributed=True)
    optimizer = Optimizer(ARTIFACTS / "optimizer_model.onnx", module, shard_state=shard_state)

    def step(index: int) -> None:
        module(*part(batches(MLP, index), rank, 2))
        optimizer.step()
        module.lazy_reset_grad()

    return state, module, optimizer, step


def saves(rank: int, out: Path) -> dict[str, str]:
    """``if rank == 0: save_checkpoint`` (then a barrier, then more steps), per-rank paths, one shared
    path; with sharded moments, the rank-0-only save raises (and the all-rank one works)."""
    outcomes: dict[str, str] = {}
    state, _, _, step = trainer(rank)
    step(0)
    if rank == 0:
        attempt(outcomes, "rank0_only", lambda: CheckpointState.save_checkpoint(state, out / "rank0_only.ckpt", True))
    dist.barrier()
    attempt(outcomes, "steps_after", lambda: [step(index) for index in (1, 2)])
    attempt(outcomes, "per_rank", lambda: CheckpointState.save_checkpoint(state, out / f"rank{rank}.ckpt", True))
    attempt(outcomes, "shared", lambda: CheckpointState.save_checkpoint(state, out / "shared.ckpt", True))
    with state.training_state.lock:  # as inside a step (a signal handler's save): refused before any collective
        attempt(outcomes, "inside_step", lambda: CheckpointState.save_checkpoint(state, out / "inside.ckpt", True))
    np.savez(out / f"params_rank{rank}.npz", **{name: p.data for name, p in state.parameters})

    state, module, _, step = trainer(rank, shard_state=True)
    module.data_parallel.checkpoint.arrival_timeout = 1.0
    step(0)
    if rank == 0:
        save = lambda: CheckpointState.save_checkpoint(state, out / "sharded_rank0_only.ckpt", True)  # noqa: E731
        attempt(outcomes, "sharded_rank0_only", save)
    dist.barrier()
    attempt(outcomes, "sharded_steps_after", lambda: step(1))
    save = lambda: CheckpointState.save_checkpoint(state, out / f"sharded_rank{rank}.ckpt", True)  # noqa: E731
    attempt(outcomes, "sharded_per_rank", save)
    return outcomes


def start_up(rank: int, out: Path) -> dict[str, str]:
    """Ranks with equal parameters but different moments, or a different learning rate, are refused."""
    outcomes: dict[str, str] = {}
    state, _, optimizer, step = trainer(rank)
    step(0)
    CheckpointState.save_checkpoint(state, out / "trained.ckpt", True)
    moved = CheckpointState.load_checkpoint(out / "trained.ckpt")
    if rank == 1:
        moments = moved.training_state.optimizer.momentums
        first = moments[sorted(moments)[0]]["momentum1"]
        first.view(-1)[0] += 1e-3
    module = Module(ARTIFACTS / "training_model.onnx", moved, distributed=True)
    attempt(outcomes, "different_moments", lambda: Optimizer(ARTIFACTS / "optimizer_model.onnx", module))
    _, _, optimizer, step = trainer(rank)
    optimizer.set_learning_rate(0.001 if rank == 0 else 0.002)
    attempt(outcomes, "different_learning_rate", lambda: step(0))
    _, _, optimizer, step = trainer(rank)
    attempt(outcomes, "same_settings", lambda: step(0))
    return outcomes


def lost_saver(rank: int, out: Path) -> dict[str, str]:
    """Rank 0 dies in the middle of a save (blocked in its write, then gone): rank 1's save raises."""
    outcomes: dict[str, str] = {}
    state, _, _, step = trainer(rank)
    step(0)
    if rank == 0:
        held = threading.Event()

        def hold_and_die() -> None:
            with path_lock(out / "lost.ckpt"):  # rank 0's own save waits for this lock
                held.set()
                time.sleep(1.0)
                os._exit(17)

        threading.Thread(target=hold_and_die, daemon=True).start()
        held.wait()
    attempt(outcomes, "lost_saver", lambda: CheckpointState.save_checkpoint(state, out / "lost.ckpt", True))
    return outcomes


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=scaled(20)))
    rank = dist.get_rank()
    if scenario == "saves":

        def run(_: str) -> None:
            outcomes = {**saves(rank, out), **start_up(rank, out)}
            (out / f"outcomes_rank{rank}.json").write_text(json.dumps(outcomes))

        run_scenarios([scenario], out, rank, run)
    else:
        (out / f"outcomes_rank{rank}.json").write_text(json.dumps(lost_saver(rank, out)))
    if scenario != "lost_saver":
        dist.barrier()
        dist.destroy_process_group()
    else:
        os._exit(0)  # the store's host is gone: no orderly shutdown


if __name__ == "__main__":
    main()
