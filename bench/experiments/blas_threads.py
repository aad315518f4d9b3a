"""Float32 ``torch.mm`` on MKL with torch's threads against one MKL thread, by product size: where
``training/blas_threads.py``'s rule (one thread while the products average under 2^16
multiply-accumulates per extra thread) comes from.

    .venv/bin/python bench/experiments/blas_threads.py [--threads 2] [--blocks 7]

Prints microseconds per product (lowest of ``--blocks`` block medians, the two settings interleaved)
and what the rule picks for a step made of products of that size alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ort_torch_train.api import set_threads
from ort_torch_train.training import blas_threads

HARNESS = Path(__file__).resolve().parents[1] / "harness"
sys.path.insert(0, str(HARNESS))

from timing import block_median_us  # noqa: E402

SIZES = [
    (32, 32, 32),
    (32, 32, 64),
    (32, 64, 64),
    (64, 64, 64),
    (32, 128, 64),
    (64, 64, 128),
    (64, 128, 128),
    (128, 128, 128),
    (256, 128, 128),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args()
    if blas_threads._set_mkl_threads is None:
        print("this torch build has no reachable MKL: nothing to compare")
        return 0
    set_threads(args.threads)
    print(f"torch.mm, float32, {args.threads} threads vs one MKL thread (us per product, lowest block median)")
    print(f"{'m x k x n':>16} {'MACs':>9} {str(args.threads) + ' threads':>10} {'1 thread':>9} {'ratio':>6}  rule")
    for m, k, n in SIZES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        calls = max(100, (1 << 22) // (m * k * n) * 20)
        threaded, serial = [], []
        for _ in range(args.blocks):
            threaded.append(block_median_us(lambda: torch.mm(a, b), calls))
            previous = blas_threads._set_mkl_threads(1)
            serial.append(block_median_us(lambda: torch.mm(a, b), calls))
            blas_threads._set_mkl_threads(previous)
        pick = "one thread" if blas_threads.serial_pays([m * k * n], args.threads) else f"{args.threads} threads"
        print(
            f"{f'{m} x {k} x {n}':>16} {m * k * n:>9} {min(threaded):>10.2f} {min(serial):>9.2f} "
            f"{min(serial) / min(threaded):>6.2f}  {pick}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
