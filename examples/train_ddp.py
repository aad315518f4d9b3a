"""Data-parallel training of ORT artifacts on N processes: ORT's loop, one Module(distributed=True).

Each rank trains on its slice of every batch; gradients are averaged across ranks at each step,
so N ranks follow the trajectory of one process on the whole batch. Rank 0 writes the ORT
checkpoint (optimizer moments gathered from their shards with ``--shard-state``).

    torchrun --nproc_per_node=2 examples/train_ddp.py [CASE_DIR] [--steps 20] [--shard-state] [--adasum] [--out runs/ddp]

CASE_DIR is an ORT case folder (``artifacts/`` + ``data.npz``, e.g. tests/fixtures/mlp_ce_adamw_sched).
Backends: gloo on CPU, NCCL with one GPU per process (``--device cuda``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer

DEFAULT_CASE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mlp_ce_adamw_sched"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", nargs="?", type=Path, default=DEFAULT_CASE)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shard-state", action="store_true", help="ZeRO-1: shard the optimizer moments")
    parser.add_argument("--adasum", action="store_true", help="combine gradients by Adasum (2, 4, 8... ranks)")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per process)")
    parser.add_argument("--out", type=Path, default=Path("runs/ddp"))
    parser.add_argument(
        "--tensor-parallel", type=int, default=1, help="ranks sharing one replica (Megatron's MLP pairs)"
    )
    args = parser.parse_args(argv)

    cuda = args.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")  # env:// from torchrun
    try:
        summary = train(args, f"cuda:{dist.get_rank() % torch.cuda.device_count()}" if cuda else "cpu")
        dist.barrier()  # no rank tears the group down while a peer still talks to it
        return summary
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace, device: str) -> dict:
    """ORT's loop on this rank's slice of each batch (its replica's, with tensor parallel); rank 0 writes
    the checkpoint."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    replica, replicas = rank // args.tensor_parallel, world_size // args.tensor_parallel
    artifacts = args.case / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(
        artifacts / "training_model.onnx",
        state,
        artifacts / "eval_model.onnx",
        device=device,
        distributed=True,
        gradient_combination="adasum" if args.adasum else "average",
        tensor_parallel_size=args.tensor_parallel,
    )
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module, shard_state=args.shard_state)
    scheduler = LinearLRScheduler(optimizer, 3, args.steps, 0.01)
    keys = json.loads((args.case / "expected.json").read_text()).get("data_keys", {})
    with np.load(args.case / "data.npz") as data:
        batches = [data[k] for k in keys.get("train") or ["x_train", "y_train"]]
    losses = []
    for step in range(args.steps):
        batch = [array[step % len(array)] for array in batches]
        share = len(batch[0]) // replicas
        loss = module(*[array[replica * share : (replica + 1) * share] for array in batch])
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    args.out.mkdir(parents=True, exist_ok=True)
    CheckpointState.save_checkpoint(state, args.out / "checkpoint", include_optimizer_state=True)
    summary = {
        "rank": rank,
        "world_size": world_size,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "checkpoint": str(args.out / "checkpoint") if rank == 0 else None,
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
