"""What the range check on indices read from data (``adapters/index_checks.py``) costs per training step.

    .venv/bin/python bench/experiments/index_check_cost.py [--models gpt32 tiny-gpt2 ...] [--threads 1]
        [--blocks 15] [--calls 50] [--no-compile]

For each benchmark model with token ids (an embedding Gather), eager and compiled (``compile=True``),
times ``module.step(optimizer, x, y)`` with the check and with it replaced by a bare wrap of negative
indices (what the converters did before, minus the wrap of out-of-range ones). The two variants are
timed in one process, interleaved (blocks of ``--calls`` steps, A B A B ...; reported: the lowest
block median of each) and each always runs under its own setting, so a compiled step never sees the
other's function. The check must cost at most 2% of a step on the benchmark models.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from ort_torch_train.api import set_threads

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))

from timing import block_median_us  # noqa: E402

from ort_torch_train.adapters import index_checks  # noqa: E402

TOKEN_MODELS = ("gpt32", "gpt128", "tiny-gpt2", "tiny-llama", "tiny-bert")
CHECKED = index_checks._checked


def _wrap_only(
    indices: torch.Tensor, lows: list[int], highs: list[int], wrap: bool, op: str, name: str
) -> torch.Tensor:
    """The converters' work without the check: negative indices counted from the end."""
    if not wrap:
        return indices
    sizes = highs[0] if len(highs) == 1 else torch.tensor(highs, device=indices.device)
    return torch.where(indices < 0, indices + sizes, indices)


@contextlib.contextmanager
def checking(enabled: bool) -> Iterator[None]:
    index_checks._checked = CHECKED if enabled else _wrap_only
    try:
        yield
    finally:
        index_checks._checked = CHECKED


def make_step(model_name: str, compile: bool, checked: bool) -> Callable[[], object]:
    """One warmed-up training step of the model, run under its check setting."""
    from model_artifacts import prepare_artifacts
    from models import LEARNING_RATE, MODELS
    from runners import ours_module

    directory = prepare_artifacts(MODELS[model_name], BENCH / ".cache", use_ort=True).directory
    x, y = (torch.from_numpy(np.load(directory / f"{name}.npy")) for name in ("x", "y"))
    with checking(checked):
        module, optimizer = ours_module(directory, LEARNING_RATE, compile=compile)
        for _ in range(5):
            module.step(optimizer, x, y)

    def step() -> object:
        with checking(checked):
            return module.step(optimizer, x, y)

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TOKEN_MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true", help="time the eager steps only")
    args = parser.parse_args()
    set_threads(args.threads)
    print(f"{args.threads} thread(s), load average {os.getloadavg()[0]:.1f}: lowest of {args.blocks} block medians")
    for model_name in args.models:
        for compile in (False,) if args.no_compile else (False, True):
            steps = {checked: make_step(model_name, compile, checked) for checked in (True, False)}
            best = {checked: float("inf") for checked in steps}
            for _ in range(args.blocks):
                for checked, step in steps.items():
                    best[checked] = min(best[checked], block_median_us(step, args.calls))
            cost = 100 * (best[True] - best[False]) / best[False]
            mode = "compiled" if compile else "eager"
            print(
                f"  {model_name:<12} {mode:<8} checked {best[True]:9.1f} us  unchecked {best[False]:9.1f} us  "
                f"check {cost:+.2f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
