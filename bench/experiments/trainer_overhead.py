"""What ``trainer.fit`` adds to ORT's hand-written loop, and what DataLoader workers change.

    .venv/bin/python bench/experiments/trainer_overhead.py [--case tests/fixtures/cnn] [--steps 200]
                                                          [--batch-size 16] [--rounds 5] [--workers 0 2]

On one case's artifacts (default: the cnn test fixture, its training arrays), in alternating rounds
(the median of each configuration is kept): the hand-written loop over pre-cut batches
(``module(x, y)``, ``optimizer.step()``, ``lazy_reset_grad()``), then ``fit`` over an
``array_loader`` with each ``--workers`` count. Every configuration trains ``--steps`` steps from the
case's checkpoint in fresh objects; the first step is left out of each rate. Prints steps per
second and fit's cost per step against the hand-written loop.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.trainer import array_loader, fit


def build(case: Path) -> tuple[Module, Optimizer]:
    artifacts = case / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    return module, Optimizer(artifacts / "optimizer_model.onnx", module)


def hand_written(case: Path, arrays: list[np.ndarray], steps: int, batch_size: int) -> float:
    module, optimizer = build(case)
    module.train()
    count = len(arrays[0]) // batch_size
    batches = [[array[i * batch_size : (i + 1) * batch_size] for array in arrays] for i in range(count)]
    module(*batches[0])
    optimizer.step()
    module.lazy_reset_grad()
    started = time.perf_counter()
    for step in range(1, steps):
        module(*batches[step % count])
        optimizer.step()
        module.lazy_reset_grad()
    return (steps - 1) / (time.perf_counter() - started)


def with_fit(case: Path, arrays: list[np.ndarray], steps: int, batch_size: int, workers: int) -> float:
    module, optimizer = build(case)
    result = fit(module, optimizer, array_loader(arrays, batch_size, workers=workers), max_steps=steps)
    return result.steps_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", type=Path, default=Path("tests/fixtures/cnn"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    with np.load(args.case / "data.npz") as data:
        x, y = data["x_train"], data["y_train"]
    arrays = [x.reshape(-1, *x.shape[2:]), y.reshape(-1)]
    rates: dict[str, list[float]] = {"hand-written loop": []}
    for workers in args.workers:
        rates[f"fit, {workers} workers"] = []
    for _ in range(args.rounds):
        rates["hand-written loop"].append(hand_written(args.case, arrays, args.steps, args.batch_size))
        for workers in args.workers:
            rates[f"fit, {workers} workers"].append(with_fit(args.case, arrays, args.steps, args.batch_size, workers))
    base = statistics.median(rates["hand-written loop"])
    print(f"{'configuration':<22} {'step/s':>9} {'us/step over the loop':>22}")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:<22} {rate:>9.1f} {1e6 / rate - 1e6 / base:>22.1f}")


if __name__ == "__main__":
    main()
