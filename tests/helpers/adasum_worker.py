"""One rank of the Adasum tests (tests/unit/distributed/test_adasum.py launches 2, 4 or 3 of them).

``python -m tests.helpers.adasum_worker SCENARIOS OUT_DIR`` (scenarios joined by ",", run in turn) with torchrun's env (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). ``hook``: a torch model under DDP with ``adasum_hook``, each rank on its own
batch; the rank's local gradients (``local/<name>``) and DDP's combined ones (``combined/<name>``).
``train``: a Module and a legacy session trained with Adasum; losses and final parameters. ``misuse``:
the error each rank saw. Each rank writes ``OUT_DIR/<scenario>_rank<r>.npz`` or ``.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tests.helpers.dist_rank_scenarios import run_scenarios
from tests.helpers.distributed_worker import MLP, batches, gloo_group, part


def hook_gradients(rank: int) -> dict[str, np.ndarray]:
    """Local and Adasum-combined gradients of a small model whose ranks see different batches; one
    parameter's gradient is zero on even ranks and one's is zero everywhere (the zero-norm guard)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ort_torch_train.distributed.adasum import adasum_hook

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
            self.odd_only = torch.nn.Parameter(torch.ones(4))
            self.dead = torch.nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            odd = float(rank % 2)
            return self.body(x).square().mean() + (self.odd_only * odd).sum() + (self.dead * 0.0).sum()

    torch.manual_seed(0)
    local, distributed = Net(), Net()
    distributed.load_state_dict(local.state_dict())
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(100 + rank)) * (1 + rank)
    local(x).backward()
    ddp = DistributedDataParallel(distributed, bucket_cap_mb=1e-4)  # small buckets: several per backward
    ddp.register_comm_hook(None, adasum_hook)
    ddp(x).backward()
    result = {f"local/{n}": p.grad.numpy().copy() for n, p in local.named_parameters()}
    result.update({f"combined/{n}": p.grad.numpy().copy() for n, p in distributed.named_parameters()})
    return result


def train(rank: int, world_size: int) -> dict[str, np.ndarray]:
    """A Module with gradient_combination="adasum" on this rank's share of 6 batches, and a legacy session
    with enable_adasum on 6 of its own; the losses and final parameters of both."""
    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from tests.helpers.legacy_models import LR, params_for, session

    artifacts = MLP / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, distributed=True, gradient_combination="adasum")
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    losses = []
    for step in range(6):
        loss = module(*part(batches(MLP, step), rank, world_size))
        optimizer.step()
        module.lazy_reset_grad()
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    result = {"losses": np.array(losses), **{f"param/{n}": p.data.copy() for n, p in state.parameters}}
    settings = {"world_rank": rank, "world_size": world_size, "data_parallel_size": world_size, "enable_adasum": True}
    sess = session(params_for("AdamOptimizer", **settings))
    rng = np.random.default_rng(3)
    legacy_losses = []
    for _ in range(6):
        x = rng.standard_normal((4 * world_size, 4)).astype(np.float32)
        y = rng.integers(0, 3, 4 * world_size).astype(np.int64)
        x, y = part([x, y], rank, world_size)
        legacy_losses.append(float(sess.run(["loss"], {"x": x, "y": y, LR: np.array([0.02], np.float32)})[0]))
    result["legacy_losses"] = np.array(legacy_losses)
    for name, value in sess.get_model_state()["full_precision"].items():
        result[f"legacy/{name}"] = np.asarray(value)
    return result


def misuse(rank: int) -> dict[str, str]:
    """What a Module and a legacy session with Adasum raise on this rank (run on 3 ranks: not a power of two)."""
    from ort_torch_train.api import CheckpointState, Module
    from ort_torch_train.errors import DistributedError
    from tests.helpers.legacy_models import params_for, session

    errors = {}
    artifacts = MLP / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    try:
        Module(artifacts / "training_model.onnx", state, distributed=True, gradient_combination="adasum")
    except DistributedError as error:
        errors["module"] = str(error)
    import torch.distributed as dist

    world_size = dist.get_world_size()
    settings = {"world_rank": rank, "world_size": world_size, "data_parallel_size": world_size, "enable_adasum": True}
    try:
        session(params_for("AdamOptimizer", **settings))
    except DistributedError as error:
        errors["legacy"] = str(error)
    return errors


def main() -> None:
    scenarios, out = sys.argv[1], Path(sys.argv[2])
    with gloo_group() as (rank, world_size):

        def run(scenario: str) -> None:
            if scenario == "hook":
                np.savez(out / f"hook_rank{rank}.npz", **hook_gradients(rank))
            elif scenario == "train":
                np.savez(out / f"train_rank{rank}.npz", **train(rank, world_size))
            elif scenario == "misuse":
                (out / f"misuse_rank{rank}.json").write_text(json.dumps(misuse(rank)))
            else:
                raise ValueError(f"unknown scenario {scenario!r}")

        run_scenarios(scenarios.split(","), out, rank, run)


if __name__ == "__main__":
    main()
