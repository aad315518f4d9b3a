"""Pipeline-parallel training of ORT artifacts: ORT's loop, one Module(pipeline=...), a stage per process.

The training graph is cut into one stage per rank (at ``--cuts``, tensor names in ORT's
``pipeline_cut_info_string`` format, or balanced by parameter count) and each batch runs through the
stages as ``--micro-batches`` micro-batches under the GPipe or 1F1B schedule. Every rank gets the
whole batch, follows the trajectory of one process and ends with the same parameters; rank 0 writes
the ORT checkpoint.

    torchrun --nproc_per_node=2 examples/train_pipeline.py [CASE_DIR] [--steps 20] [--micro-batches 4]
        [--schedule gpipe|1f1b] [--cuts TENSOR,...] [--out runs/pipeline]

CASE_DIR is an ORT case folder (``artifacts/`` + ``data.npz``, e.g. tests/fixtures/mlp_ce_adamw_sched).
CPU processes on gloo.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch.distributed as dist

from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from ort_torch_train.distributed.pipeline_plan import PipelineOptions

DEFAULT_CASE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mlp_ce_adamw_sched"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", nargs="?", type=Path, default=DEFAULT_CASE)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b"])
    parser.add_argument("--cuts", default="", help="ORT's cut string: tensor names, ',' between cuts")
    parser.add_argument("--out", type=Path, default=Path("runs/pipeline"))
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")  # env:// from torchrun
    try:
        summary = train(args)
        dist.barrier()  # no rank tears the group down while a peer still talks to it
        return summary
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> dict:
    """ORT's loop on every batch, run through this rank's stage; rank 0 writes the checkpoint."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    artifacts = args.case / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    pipeline = PipelineOptions(world_size, args.micro_batches, args.cuts, args.schedule)
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", pipeline=pipeline)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    scheduler = LinearLRScheduler(optimizer, 3, args.steps, 0.01)
    keys = json.loads((args.case / "expected.json").read_text()).get("data_keys", {})
    with np.load(args.case / "data.npz") as data:
        batches = [data[k] for k in keys.get("train") or ["x_train", "y_train"]]
    losses = []
    for step in range(args.steps):
        loss = module(*[array[step % len(array)] for array in batches])
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
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
