"""A benchmark worker: one configuration in its own process, driven over stdin/stdout.

    python bench/harness/worker.py --config ours --model mlp --artifacts DIR --threads 2 --device cpu --lr 1e-3 --warmup 20

It builds the runner, runs the warmup steps and answers ``ready``; then each ``run N`` line times
N steps and answers the per-step phase times; ``quit`` answers the peak memory, the last loss and the
attention ops and kernels that one profiled step ran.
Answers are single JSON lines on the original stdout; anything libraries print goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
from runners import CONFIGS, PRECISIONS, Runner, make_runner
from timing import peak_rss_mb, time_phased_steps


def protocol_stream():
    """The original stdout, kept for answers; fd 1 then points at stderr so stray prints cannot interleave."""
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return stream


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=CONFIGS, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--artifacts", type=Path, required=True, help="artifact directory (with x.npy, y.npy)")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--torch-inputs", action="store_true", help="ours/ours-compile: torch tensors, not numpy")
    parser.add_argument("--mixed-precision", choices=sorted(PRECISIONS), help="autocast dtype (default float32)")
    args = parser.parse_args()
    answers = protocol_stream()

    def answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")

    started = time.perf_counter()
    x, y = np.load(args.artifacts / "x.npy"), np.load(args.artifacts / "y.npy")
    loaded = time.perf_counter()
    runner = make_runner(
        args.config,
        args.artifacts,
        x,
        y,
        threads=args.threads,
        device=args.device,
        lr=args.lr,
        model_name=args.model,
        torch_inputs=args.torch_inputs,
        precision=args.mixed_precision,
    )
    built = time.perf_counter()
    rss_after_load = peak_rss_mb()
    first_step = time_phased_steps(runner.phases, 1, runner.sync)["step"][0]
    time_phased_steps(runner.phases, max(args.warmup - 1, 0), runner.sync)
    answer(
        {
            "ready": True,
            "setup_s": time.perf_counter() - started,
            "load_s": built - loaded,
            "first_step_s": first_step,
            "rss_after_load_mb": rss_after_load,
        }
    )
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "run":
            answer(time_phased_steps(runner.phases, int(rest[0]), runner.sync))
        elif command == "quit":
            peak = runner.peak_memory_mb() if runner.peak_memory_mb else peak_rss_mb()
            last_loss = runner.last_loss()  # before the profiled step, which the other configurations do not take
            kernels = None if args.config == "ort" else attention_kernels(runner)
            answer({"peak_memory_mb": peak, "last_loss": last_loss, "attention_kernels": kernels})
            return 0
    return 1


def attention_kernels(runner: Runner) -> list[str]:
    """The ops and GPU kernels of one profiled step whose names hold "attention", "flash" or "fmha"
    (template arguments and signatures cut off, autograd nodes left out)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as profiler:
        for _, phase in runner.phases:
            phase()
        if runner.sync:
            runner.sync()
    names = {e.name.removeprefix("void ").split("<")[0].split("(")[0] for e in profiler.events()}
    autograd = re.compile(r"^autograd::|Backward\d*$")  # the autograd nodes around the ops
    return sorted(
        n for n in names if any(word in n.lower() for word in ("attention", "flash", "fmha")) and not autograd.search(n)
    )


if __name__ == "__main__":
    sys.exit(main())
