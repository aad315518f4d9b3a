"""A benchmark worker: one configuration in its own process, driven over stdin/stdout.

    python bench/worker.py --config ours --model mlp --artifacts DIR --threads 2 --device cpu --lr 1e-3 --warmup 20

It builds the runner, runs the warmup steps and answers ``ready``; then each ``run N`` line times
N steps and answers the per-step phase times; ``quit`` answers the peak memory and the last loss.
Answers are single JSON lines on the original stdout; anything libraries print goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from runners import CONFIGS, make_runner
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
    args = parser.parse_args()
    answers = protocol_stream()

    def answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")

    started = time.perf_counter()
    x, y = np.load(args.artifacts / "x.npy"), np.load(args.artifacts / "y.npy")
    runner = make_runner(args.config, args.artifacts, x, y, threads=args.threads, device=args.device,
                         lr=args.lr, model_name=args.model, torch_inputs=args.torch_inputs)
    time_phased_steps(runner.phases, args.warmup, runner.sync)
    answer({"ready": True, "setup_s": time.perf_counter() - started})
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "run":
            answer(time_phased_steps(runner.phases, int(rest[0]), runner.sync))
        elif command == "quit":
            peak = runner.peak_memory_mb() if runner.peak_memory_mb else peak_rss_mb()
            answer({"peak_memory_mb": peak, "last_loss": runner.last_loss()})
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
