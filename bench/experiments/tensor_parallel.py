"""Step time of tensor parallel and pipeline parallel against data parallel (DDP) on 2 processes, and 1 process.

Each configuration trains the same model's artifacts with ORT's loop on the same global batch:
"1 rank" the whole batch, "2 ranks, DDP" (``Module(distributed=True)``) half the batch each,
"2 ranks, TP" (``Module(tensor_parallel_size=2)``) the whole batch on both ranks, each computing half
of every MLP pair and half of every attention block's heads, and "2 ranks, pipeline GPipe|1F1B"
(``Module(pipeline=PipelineOptions(2, MICRO_BATCHES, schedule=...))``) the whole batch cut into
micro-batches through two stages. The default model, ``qkv-encoder``, has separate query, key and
value projections, so that TP splits its attention too. Configurations are interleaved so a busy
machine slows them alike; the report gives each one's median step time and the ratios to DDP's, and
the bytes of parameters + gradients + optimizer moments the state of each configuration's fullest rank
holds after the steps (a DTensor's local shard counted), against one process's.
The ranks run under ``ort_torch_train.distributed.launch.run_local_ranks`` (killed and reaped on a
failure or a timeout).

    .venv/bin/python bench/experiments/tensor_parallel.py [--model qkv-encoder] [--steps 4] [--warmup 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

MICRO_BATCHES = 4
CONFIGURATIONS = {  # name -> (world size, strategy)
    "1 rank": (1, "none"),
    "2 ranks, DDP": (2, "ddp"),
    "2 ranks, TP": (2, "tp"),
    "2 ranks, pipeline GPipe": (2, "gpipe"),
    "2 ranks, pipeline 1F1B": (2, "1f1b"),
}


class QkvBlock(nn.Module):
    """Post-LN encoder layer with separate q/k/v projections (BERT's layout) and a ReLU MLP."""

    def __init__(self, hidden: int, heads: int, feedforward: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.output = nn.Linear(hidden, hidden)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, feedforward), nn.Linear(feedforward, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        q, k, v = (
            projection(x).view(batch, tokens, self.heads, hidden // self.heads).transpose(1, 2)
            for projection in (self.query, self.key, self.value)
        )
        scores = q @ k.transpose(-1, -2) / (hidden // self.heads) ** 0.5
        attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, tokens, hidden)
        x = self.norm1(x + self.output(attended))
        return self.norm2(x + self.fc2(torch.relu(self.fc1(x))))


class QkvEncoder(nn.Module):
    """``layers`` QkvBlocks, mean-pooled over tokens, then a linear head."""

    def __init__(self, layers: int = 4, hidden: int = 256, heads: int = 4, feedforward: int = 1024) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(QkvBlock(hidden, heads, feedforward) for _ in range(layers)))
        self.head = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x).mean(1))


def bench_model(name: str):  # type: ignore[no-untyped-def]  # the harness's BenchModel
    from models import MODELS, BenchModel

    if name != "qkv-encoder":
        return MODELS[name]
    description = "4 post-LN layers, d256, 4 heads (separate q/k/v), ff 1024, ReLU; mean-pool + Linear(256,4)"
    return BenchModel(name, description, QkvEncoder, (128, 256), 16, 4, steps=4, warmup=2)


def worker(directory: Path, steps: int, warmup: int, strategy: str) -> None:
    """One rank: train and print its step times."""
    import torch.distributed as dist

    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.distributed.pipeline_plan import PipelineOptions

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    pipelined = strategy in ("gpipe", "1f1b")
    with warnings.catch_warnings(record=True) as caught:  # tensor parallel names the layers it leaves whole
        warnings.simplefilter("always")
        module = Module(
            directory / "training_model.onnx",
            state,
            distributed=strategy == "ddp",
            tensor_parallel_size=world_size if strategy == "tp" else 1,
            pipeline=PipelineOptions(world_size, MICRO_BATCHES, schedule=strategy) if pipelined else None,
        )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    x, y = np.load(directory / "x.npy"), np.load(directory / "y.npy")
    replicas = world_size if strategy == "ddp" else 1
    share, replica = len(x) // replicas, rank if strategy == "ddp" else 0
    inputs = [torch.from_numpy(a[replica * share : (replica + 1) * share]) for a in (x, y)]
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    replicated = [str(w.message) for w in caught if "match no tensor-parallel pattern" in str(w.message)]
    report = {"step_s": times, "replicated": replicated, "held_bytes": held_bytes(state.training_state)}
    print(json.dumps(report), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def held_bytes(training_state) -> int:  # type: ignore[no-untyped-def]  # a TrainingState
    """Bytes of the parameters, their gradients and optimizer moments this rank's state holds (local shards)."""
    from torch.distributed.tensor import DTensor

    def nbytes(tensor: torch.Tensor | None) -> int:
        held = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        return 0 if held is None else held.numel() * held.element_size()

    moments = training_state.optimizer.momentums if training_state.optimizer is not None else {}
    return sum(
        nbytes(param) + nbytes(param.grad) + sum(nbytes(moment) for moment in moments.get(name, {}).values())
        for name, param in training_state.params.items()
    )


def run_world(world_size: int, strategy: str, directory: Path, args: argparse.Namespace) -> list[dict]:
    """Launch ``world_size`` ranks; return each rank's report."""
    from ort_torch_train.distributed.launch import run_local_ranks

    threads = max(1, (os.cpu_count() or 1) // world_size)
    command = [sys.executable, __file__, "--worker", str(directory), "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup), "--strategy", strategy, "--model", args.model]
    outputs = run_local_ranks(command, world_size, args.timeout, {**os.environ, "OMP_NUM_THREADS": str(threads)})
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qkv-encoder")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", type=Path)
    parser.add_argument("--strategy", default="none", help=argparse.SUPPRESS)  # a worker's setting
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.warmup, args.strategy)
        return
    from model_artifacts import prepare_artifacts

    model = bench_model(args.model)
    artifacts = prepare_artifacts(model, BENCH / ".cache", use_ort=True)
    times: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    held: dict[str, int] = {}
    replicated: list[str] = []
    for _ in range(args.rounds):
        for name, (world_size, strategy) in CONFIGURATIONS.items():
            reports = run_world(world_size, strategy, artifacts.directory, args)
            times[name] += reports[0]["step_s"]
            held[name] = max(report["held_bytes"] for report in reports)
            replicated = replicated or reports[0]["replicated"]
    median = {name: statistics.median(t) for name, t in times.items()}
    print(
        json.dumps(
            {
                "model": args.model,
                "artifacts": artifacts.generator,
                "global_batch": model.batch,
                "micro_batches": MICRO_BATCHES,
                "tp_replicated_layers": replicated,
                "median_step_s": median,
                "step_time_over_ddp": {name: m / median["2 ranks, DDP"] for name, m in median.items()},
                "speedup_vs_1_rank": {name: median["1 rank"] / m for name, m in median.items()},
                "held_bytes_per_rank": held,
                "held_vs_1_rank": {name: b / held["1 rank"] for name, b in held.items()},
                "cpu_count": os.cpu_count(),
                "load_average": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
