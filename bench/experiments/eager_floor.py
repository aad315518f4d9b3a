"""What an eager training step costs, against this machine's cost of one trivial op and one autograd node.

    .venv/bin/python bench/experiments/eager_floor.py [--models tiny-gpt2 tiny-llama tiny-bert] [--threads 2] [--rounds 5]
                                          [--blocks 9] [--no-ort] [--cache bench/.cache]

For each model: the eager step of ORT's loop (config (a): ``module(x, y)``, ``optimizer.step()``,
``lazy_reset_grad()``) and ORT's step on the same artifacts, each in its own worker, timed in
alternating rounds (``orchestrate.run_model``; ``--no-ort``: this project's generator makes the
artifacts and ORT is not timed). Then, in this process and in alternating blocks (the lowest block
median of each is kept), the parts of the step on its converted training graph: the forward without
autograd, the forward with it, and forward + backward. Counted once: the aten ops of the forward and
of the backward (a TorchDispatchMode) and the autograd nodes the backward runs. The unit costs come
from chains of multiplies of a 1-element tensor (110 against 10 of them, timed after each model): an
op recorded for autograd, a backward node, and the fixed cost of one ``backward()`` call. The floor,
forward ops x recorded-op cost + nodes x node cost + the call's fixed cost, is what the forward and
backward would take if each of their ops cost what a 1-element multiply does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ort_torch_train.api import set_threads

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))

from model_artifacts import ArtifactSet, prepare_artifacts  # noqa: E402
from models import MODELS  # noqa: E402
from orchestrate import Settings, run_model  # noqa: E402
from timing import block_median_us, render_table  # noqa: E402

from ort_torch_train.api import CheckpointState, Module, Optimizer  # noqa: E402
from ort_torch_train.training.blas_threads import blas_threads_for  # noqa: E402

CHAIN_SHORT, CHAIN_LONG = 10, 110


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def autograd_nodes(output: torch.Tensor) -> int:
    """The nodes a backward from ``output`` runs (AccumulateGrad included)."""
    seen, pending = set(), [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        pending.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def lowest_block_medians(calls: dict[str, Callable[[], object]], blocks: int, calls_per_block: int) -> dict[str, float]:
    """Each call's lowest block median (us) over ``blocks`` rounds of alternating blocks."""
    best = {name: float("inf") for name in calls}
    for _ in range(blocks):
        for name, call in calls.items():
            best[name] = min(best[name], block_median_us(call, calls_per_block))
    return best


def unit_costs(blocks: int) -> dict[str, float]:
    """us per op recorded for autograd, per backward node, and per backward() call (fixed)."""
    x = torch.ones(1, requires_grad=True)

    def chain(length: int) -> torch.Tensor:
        y = x
        for _ in range(length):
            y = y * 1.0
        return y

    calls = {}
    for length in (CHAIN_SHORT, CHAIN_LONG):
        calls[f"forward {length}"] = lambda length=length: chain(length)
        calls[f"backward {length}"] = lambda length=length: chain(length).backward()
    times = lowest_block_medians(calls, blocks, 20)
    per = {
        kind: (times[f"{kind} {CHAIN_LONG}"] - times[f"{kind} {CHAIN_SHORT}"]) / (CHAIN_LONG - CHAIN_SHORT)
        for kind in ("forward", "backward")
    }
    return {
        "tracked op": per["forward"],
        "node": per["backward"] - per["forward"],
        "backward call": times[f"backward {CHAIN_SHORT}"] - CHAIN_SHORT * per["backward"],
    }


def measure_model(artifacts: ArtifactSet, blocks: int) -> dict[str, float]:
    """The parts of the eager step on the converted training graph (us), and its op and node counts."""
    directory = artifacts.directory
    module = Module(directory / "training_model.onnx", CheckpointState.load_checkpoint(directory / "checkpoint"))
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    x, y = np.load(directory / "x.npy"), np.load(directory / "y.npy")
    inputs = [torch.from_numpy(x), torch.from_numpy(y)]
    module.train()

    def step():
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()

    for _ in range(5):
        step()
    graph, params = module.train_graph, [module.training_state.params[n] for n in module.train_layout.params]
    converted = graph.module_for(inputs, params)
    grads = [param.grad for param in params if param.grad is not None]

    def forward_untracked():
        with torch.no_grad():
            converted(*inputs, *params)

    def forward_backward():
        torch._foreach_zero_(grads)
        converted(*inputs, *params)[0].backward()

    with blas_threads_for(graph.matrix_products(converted), torch.device("cpu")):
        with _OpCounter() as forward_ops:
            loss = converted(*inputs, *params)[0]
        nodes = autograd_nodes(loss)
        with _OpCounter() as backward_ops:
            loss.backward()
        times = lowest_block_medians(
            {
                "forward untracked": forward_untracked,
                "forward": lambda: converted(*inputs, *params),
                "forward+backward": forward_backward,
            },
            blocks,
            20,
        )
    return {**times, "forward ops": forward_ops.count, "backward ops": backward_ops.count, "nodes": nodes}


def step_us(name: str, artifacts: ArtifactSet, settings: Settings, log_dir: Path) -> dict[str, float]:
    """Median step (us) of the eager step (a) and, where ORT can run these artifacts, of ORT's."""
    log_dir.mkdir(parents=True, exist_ok=True)
    configs = ["ours"] if artifacts.ort_missing else ["ours", "ort"]
    results = run_model(MODELS[name], artifacts, configs, settings, log_dir, progress=lambda _: None)
    for result in results:
        if result.error:
            raise RuntimeError(f"{name} / {result.config}: {result.error}")
    return {result.config: result.median() * 1e6 for result in results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["tiny-gpt2", "tiny-llama", "tiny-bert"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the (a) and ORT workers")
    parser.add_argument("--blocks", type=int, default=9, help="alternating blocks of 20 calls each, in this process")
    parser.add_argument("--steps", type=int, help="timed steps per round (default: the model's)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per round (default: the model's)")
    parser.add_argument("--no-ort", action="store_true", help="use this project's generator and skip ORT")
    parser.add_argument("--cache", type=Path, default=BENCH / ".cache", help="artifact cache")
    args = parser.parse_args()
    set_threads(args.threads)
    settings = Settings(threads=args.threads, device="cpu", rounds=args.rounds, steps=args.steps, warmup=args.warmup)
    rows, ort_missing = [], set()
    for name in args.models:
        artifacts = prepare_artifacts(MODELS[name], args.cache, use_ort=not args.no_ort)
        if artifacts.ort_missing:
            ort_missing.add(artifacts.ort_missing)
        steps = step_us(name, artifacts, settings, args.cache / "logs")
        parts = measure_model(artifacts, args.blocks)
        units = unit_costs(args.blocks)
        floor = parts["forward ops"] * units["tracked op"] + parts["nodes"] * units["node"] + units["backward call"]
        ort = steps.get("ort")
        ratio = lambda value: "-" if ort is None else f"{value / ort:.2f}x"
        rows.append(
            [
                name,
                f"{steps['ours']:.0f}",
                f"{parts['forward untracked']:.0f}",
                f"{parts['forward']:.0f}",
                f"{parts['forward+backward'] - parts['forward']:.0f}",
                f"{parts['forward ops']} / {parts['backward ops']} / {parts['nodes']}",
                " / ".join(f"{units[kind]:.2f}" for kind in ("tracked op", "node", "backward call")),
                f"{floor:.0f}",
                "-" if ort is None else f"{ort:.0f}",
                ratio(steps["ours"]),
                ratio(floor),
            ]
        )
    for reason in sorted(ort_missing):
        print(f"ORT not timed: {reason}")
    print(f"us, {args.threads} threads; unit costs: a recorded op / a backward node / a backward() call's fixed cost")
    print(
        render_table(
            [
                "model",
                "eager step (a)",
                "forward, no autograd",
                "forward",
                "backward",
                "ops fwd / bwd / nodes",
                "unit costs",
                "floor",
                "ORT step",
                "(a) / ORT",
                "floor / ORT",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
