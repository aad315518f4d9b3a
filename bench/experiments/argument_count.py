"""What a compiled CPU call pays per tensor argument: one in-place update of N small tensors against the
same update of one flat tensor of their total size, through ``torch.compile`` with the C++ wrapper.
Why ``state/flat.py`` hands one-graph steps four flat buffers instead of four tensors a parameter.

    .venv/bin/python bench/experiments/argument_count.py [--threads 2] [--elements 32] [--blocks 7]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ort_torch_train.api import set_threads

HARNESS = Path(__file__).resolve().parents[1] / "harness"
sys.path.insert(0, str(HARNESS))

from timing import block_median_us  # noqa: E402


def _scale(tensors: list[torch.Tensor]) -> None:
    torch._foreach_mul_(tensors, 1.0000001)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--elements", type=int, default=32, help="elements of each small tensor")
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args()
    set_threads(args.threads)
    print(f"compiled in-place update, C++ wrapper, {args.threads} threads (us per call, lowest block median)")
    print(f"{'tensors':>8} {'separate':>9} {'one flat':>9}")
    for count in (1, 4, 40, 166):
        separate = [torch.randn(args.elements) for _ in range(count)]
        flat = [torch.randn(args.elements * count)]
        timings = []
        for tensors in (separate, flat):
            compiled = torch.compile(_scale, fullgraph=True, dynamic=False, options={"cpp_wrapper": True})
            with torch.no_grad():
                compiled(tensors)
                timings.append(min(block_median_us(lambda: compiled(tensors), 2000) for _ in range(args.blocks)))
        print(f"{count:>8} {timings[0]:>9.1f} {timings[1]:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
