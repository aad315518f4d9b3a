"""Time one optimizer step: this project's ORT AdamW against torch.optim.AdamW on the same parameters.

    python bench/experiments/bench_optimizer.py [--device cpu|cuda] [--iters 200] [--warmup 20] [--threads N]

Parameter sets: a 4-layer d_model=256 transformer (embeddings, attention, FFN, LayerNorms) and the
refcorpus MLP (Linear(20,32)-ReLU-Linear(32,5)). Prints the median step time and its ratio to
``torch.optim.AdamW(fused=True)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from ort_torch_train.api import set_threads
from ort_torch_train.optim.adamw import ADAMW_ALGORITHM, AdamWHyperparameters, adamw
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.optimizer_model import OptimizerSpec
from ort_torch_train.optim.scratch import make_scratch
from ort_torch_train.state.training_state import TrainingState

HARNESS = Path(__file__).resolve().parents[1] / "harness"
sys.path.insert(0, str(HARNESS))

from timing import interleaved_step_times, median, render_table  # noqa: E402


def transformer_shapes(
    layers: int = 4, d_model: int = 256, d_ff: int = 1024, vocab: int = 1000, context: int = 128
) -> list[tuple[int, ...]]:
    """Parameter shapes of a small pre-LN transformer encoder."""
    shapes = [(vocab, d_model), (context, d_model)]
    for _ in range(layers):
        shapes += [(d_model,), (d_model,)]  # LayerNorm 1
        shapes += [(d_model, d_model), (d_model,)] * 4  # q, k, v, out projections
        shapes += [(d_model,), (d_model,)]  # LayerNorm 2
        shapes += [(d_ff, d_model), (d_ff,), (d_model, d_ff), (d_model,)]  # FFN
    return shapes + [(d_model,), (d_model,)]


MLP_SHAPES = [(32, 20), (32,), (5, 32), (5,)]


def contenders(shapes: list[tuple[int, ...]], device: torch.device) -> dict[str, Callable[[], None]]:
    """name -> a callable doing one optimizer step on its own copy of the parameters."""
    gen = torch.Generator().manual_seed(0)
    initial = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen).to(device) for s in shapes]

    def fresh() -> list[torch.nn.Parameter]:
        params = [torch.nn.Parameter(t.to(device)) for t in initial]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        return params

    def ours(adam_mode: int, implementation: str) -> Callable[[], None]:
        params = fresh()
        m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        scratch = make_scratch(params, 2) if implementation == "foreach" else None  # as OptimizerEngine does
        counter = [0]

        def step() -> None:
            counter[0] += 1
            adamw(
                params,
                grads,
                m,
                v,
                AdamWHyperparameters(1e-3, 0.9, 0.999, 1e-6, 0.01, adam_mode, True),
                step=counter[0],
                implementation=implementation,
                scratch=scratch,
            )

        return step

    def torch_adamw(**flags) -> Callable[[], None]:
        optimizer = torch.optim.AdamW(fresh(), lr=1e-3, eps=1e-6, weight_decay=0.01, **flags)
        return optimizer.step

    def engine() -> Callable[[], None]:
        state = TrainingState({f"p{i}": p for i, p in enumerate(fresh())})
        attributes = {"epsilon": 1e-6, "weight_decay": 0.01, "adam_mode": 1, "correct_bias": 1}
        spec = OptimizerSpec(ADAMW_ALGORITHM, ADAMW_ALGORITHM.hyperparameters(attributes))
        return OptimizerEngine(spec, state, list(state.params)).step

    return {
        "torch AdamW fused": torch_adamw(fused=True),
        "torch AdamW foreach": torch_adamw(foreach=True),
        "ours mode 1 fused": ours(1, "fused"),
        "ours mode 1 foreach": ours(1, "foreach"),
        "ours mode 0 fused": ours(0, "fused"),
        "ours mode 0 foreach": ours(0, "foreach"),
        "ours mode 1 single": ours(1, "single"),
        "OptimizerEngine.step (mode 1)": engine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        set_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
        f"median of {args.iters} steps after {args.warmup} warmup"
    )
    for title, shapes in (("transformer 4 x d256", transformer_shapes()), ("mlp 20-32-5", MLP_SHAPES)):
        numel = sum(torch.Size(s).numel() for s in shapes)
        print(f"\n{title}: {len(shapes)} tensors, {numel:,} parameters")
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        times = interleaved_step_times(
            contenders(shapes, device),
            rounds=10,
            steps_per_round=max(1, args.iters // 10),
            warmup=args.warmup,
            sync=sync,
        )
        timings = {name: median(values) for name, values in times.items()}
        baseline = timings["torch AdamW fused"]
        rows = [[name, f"{seconds * 1e6:.1f}", f"{seconds / baseline:.2f}x"] for name, seconds in timings.items()]
        print(render_table(["implementation", "median us", "vs torch fused"], rows))


if __name__ == "__main__":
    main()
