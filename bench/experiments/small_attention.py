"""One compiled attention, forward and backward, as SDPA and as ``attention_products`` (passes/small_attention.py).

    .venv/bin/python bench/experiments/small_attention.py [--threads 2] [--shapes 4x2x8x16 8x4x32x32 ...]

Each shape (batch x heads x positions x head size, causal) is compiled both ways with the defaults
``compile=True`` uses on CPU (C++ wrapper, loops parallel from 16384 elements a thread); the two
are timed in alternating blocks and the lowest block median of each is printed, with whether
``small_attention_products`` (passes/small_attention.py) would rewrite that shape.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from ort_torch_train.api import set_threads
from ort_torch_train.passes.small_attention import HEAD_MULTIPLE, MAX_SCORES, attention_products
from ort_torch_train.training.compile.settings import MIN_CHUNK_SIZE

HARNESS = Path(__file__).resolve().parents[1] / "harness"
sys.path.insert(0, str(HARNESS))

from timing import block_median_us  # noqa: E402

SHAPES = ("4x2x8x16", "4x2x8x8", "8x4x32x8", "8x4x32x32", "8x4x32x128", "4x4x64x32")


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return attention_products(q, k, v, is_causal=True)


def time_shape(batch: int, heads: int, positions: int, head: int, blocks: int) -> tuple[float, float]:
    """Lowest block medians (us) of SDPA and of the products, forward and backward."""
    q, k, v = (torch.randn(batch, heads, positions, head, requires_grad=True) for _ in range(3))
    weights = torch.randn(batch, heads, positions, head)
    torch._dynamo.reset()  # each shape compiles anew: no recompile limit across shapes
    steps = []
    for forward in (_sdpa, _products):
        compiled = torch.compile(forward, fullgraph=True, dynamic=False)

        def step(compiled=compiled):
            return torch.autograd.grad(compiled(q, k, v), (q, k, v), weights)

        for _ in range(20):
            step()
        steps.append(step)
    calls = max(20, int(2e5 / (batch * heads * positions * positions * head / 1000 + 50)))
    best = [float("inf"), float("inf")]
    for _ in range(blocks):
        for index, step in enumerate(steps):
            best[index] = min(best[index], block_median_us(step, calls))
    return best[0], best[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    set_threads(args.threads)
    torch._inductor.config.cpp_wrapper = True
    torch._inductor.config.cpp.min_chunk_size = MIN_CHUNK_SIZE
    print(f"{args.threads} thread(s), causal, forward + backward, lowest of {args.blocks} block medians")
    print(f"{'shape':>12}  {'SDPA':>9}  {'products':>9}  ratio  rewritten")
    for shape in args.shapes:
        batch, heads, positions, head = (int(part) for part in shape.split("x"))
        sdpa, products = time_shape(batch, heads, positions, head, args.blocks)
        rewritten = head % HEAD_MULTIPLE == 0 and positions * positions <= MAX_SCORES
        print(f"{shape:>12}  {sdpa:7.1f}us  {products:7.1f}us  {products / sdpa:4.2f}x  {rewritten}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
