"""Step time of tensor parallel against data parallel (DDP) on 2 processes, and 1 process, same global batch.

Each configuration trains the benchmark model's artifacts with ORT's loop: "1 rank" the whole batch,
"2 ranks, DDP" (``Module(distributed=True)``) half the batch each, "2 ranks, TP"
(``Module(tensor_parallel_size=2)``) the whole batch on both ranks, each computing half of every MLP
pair. Configurations are interleaved so a busy machine slows them alike; the report gives each
one's median step time and the ratios.

    .venv/bin/python bench/experiments/tensor_parallel.py [--model encoder] [--steps 4] [--warmup 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))


def worker(directory: Path, steps: int, warmup: int, tensor_parallel: int) -> None:
    """One rank: train and print its step times."""
    import torch
    import torch.distributed as dist

    from ort_torch_train.api import CheckpointState, Module, Optimizer

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the layers that stay replicated
        module = Module(
            directory / "training_model.onnx",
            state,
            distributed=world_size > 1 and tensor_parallel == 1,
            tensor_parallel_size=tensor_parallel,
        )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    x, y = np.load(directory / "x.npy"), np.load(directory / "y.npy")
    replicas = world_size // tensor_parallel
    share, replica = len(x) // replicas, rank // tensor_parallel
    inputs = [torch.from_numpy(a[replica * share : (replica + 1) * share]) for a in (x, y)]
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    print(json.dumps({"step_s": times}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run_world(world_size: int, tensor_parallel: int, directory: Path, args: argparse.Namespace) -> list[dict]:
    """Launch ``world_size`` ranks (env:// rendezvous, as torchrun); return each rank's report."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    threads = max(1, (os.cpu_count() or 1) // world_size)
    command = [sys.executable, __file__, "--worker", str(directory), "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup), "--tensor-parallel", str(tensor_parallel)]
    procs = [
        subprocess.Popen(
            command,
            env={
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": str(threads),
            },
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]
    outputs = [proc.communicate(timeout=args.timeout)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"world {world_size}, tensor parallel {tensor_parallel}: a rank failed")
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", type=Path)
    parser.add_argument("--tensor-parallel", type=int, default=1, help=argparse.SUPPRESS)  # a worker's setting
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.warmup, args.tensor_parallel)
        return
    from model_artifacts import prepare_artifacts
    from models import MODELS

    model = MODELS[args.model]
    artifacts = prepare_artifacts(model, BENCH / ".cache", use_ort=True)
    configurations = {"1 rank": (1, 1), "2 ranks, DDP": (2, 1), "2 ranks, TP": (2, 2)}
    times: dict[str, list[float]] = {name: [] for name in configurations}
    for _ in range(args.rounds):
        for name, (world_size, tensor_parallel) in configurations.items():
            times[name] += run_world(world_size, tensor_parallel, artifacts.directory, args)[0]["step_s"]
    median = {name: statistics.median(t) for name, t in times.items()}
    print(
        json.dumps(
            {
                "model": args.model,
                "global_batch": model.batch,
                "median_step_s": median,
                "tp_over_ddp_step_time": median["2 ranks, TP"] / median["2 ranks, DDP"],
                "speedup_vs_1_rank": {name: median["1 rank"] / m for name, m in median.items()},
                "cpu_count": os.cpu_count(),
                "load_average": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
