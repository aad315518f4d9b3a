"""Step time of data-parallel training, 1 vs 2 processes (gloo on CPU, NCCL on CUDA), same global batch.

Each configuration trains the benchmark model's artifacts with ORT's loop on ``Module(distributed=True)``;
a world of N ranks gives each rank 1/N of the fixed batch (strong scaling). Configurations (1 rank,
2 ranks, 2 ranks with ``Optimizer(shard_state=True)``) are interleaved so a busy machine slows them
alike; the report gives each one's median step time, the ratios and the optimizer-moment bytes each
rank holds.

    .venv/bin/python bench/experiments/distributed.py [--model encoder] [--steps 4] [--warmup 2] [--rounds 2] [--threads N] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ort_torch_train.distributed.launch import run_local_ranks

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))


def worker(directory: Path, steps: int, warmup: int, device: str, shard_state: bool) -> None:
    """One rank: train and print its step times and moment bytes."""
    import torch
    import torch.distributed as dist

    from ort_torch_train.api import CheckpointState, Module, Optimizer

    cuda = device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    target = f"cuda:{rank % torch.cuda.device_count()}" if cuda else "cpu"
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, device=target, distributed=world_size > 1)
    optimizer = Optimizer(directory / "optimizer_model.onnx", module, shard_state=shard_state)
    x, y = np.load(directory / "x.npy"), np.load(directory / "y.npy")
    share = len(x) // world_size
    inputs = [torch.from_numpy(a[rank * share : (rank + 1) * share]).to(target) for a in (x, y)]
    times = []
    for step in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        if cuda:
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    moments = state.training_state.optimizer.momentums
    moment_bytes = sum(t.numel() * t.element_size() for m in moments.values() for t in m.values())
    print(json.dumps({"world_size": world_size, "step_s": times, "moment_bytes": moment_bytes}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run_world(world_size: int, shard_state: bool, directory: Path, args: argparse.Namespace) -> list[dict]:
    """Launch ``world_size`` ranks (env:// rendezvous, as torchrun), every one reaped; return each rank's report."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // world_size)
    command = [sys.executable, __file__, "--worker", str(directory), "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup), "--device", args.device, *(["--shard-state"] if shard_state else [])]
    outputs = run_local_ranks(command, world_size, args.timeout, {**os.environ, "OMP_NUM_THREADS": str(threads)})
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads per process (default: the cores divided among the ranks)"
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", type=Path)
    parser.add_argument("--shard-state", action="store_true", help=argparse.SUPPRESS)  # a worker's setting
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.warmup, args.device, args.shard_state)
        return
    from model_artifacts import prepare_artifacts
    from models import MODELS

    model = MODELS[args.model]
    artifacts = prepare_artifacts(model, BENCH / ".cache", use_ort=True)
    configurations = {"1 rank": (1, False), "2 ranks": (2, False), "2 ranks, shard_state": (2, True)}
    times: dict[str, list[float]] = {name: [] for name in configurations}
    moment_bytes: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for name, (world_size, shard_state) in configurations.items():
            reports = run_world(world_size, shard_state, artifacts.directory, args)
            times[name] += reports[0]["step_s"]
            moment_bytes[name] = [report["moment_bytes"] for report in reports]
    median = {name: statistics.median(t) for name, t in times.items()}
    print(
        json.dumps(
            {
                "model": args.model,
                "device": args.device,
                "global_batch": model.batch,
                "median_step_s": median,
                "speedup_vs_1_rank": {name: median["1 rank"] / m for name, m in median.items()},
                "moment_bytes_per_rank": moment_bytes,
                "threads_per_process": {n: args.threads or max(1, (os.cpu_count() or 1) // n) for n in (1, 2)},
                "cpu_count": os.cpu_count(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
