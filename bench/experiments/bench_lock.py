"""Cost of the per-state lock that serialises Module/Optimizer/save calls (issue 14).

Times an uncontended ``with state.lock:`` (the TrainingState's RLock) against an empty loop, in
one run, and prints the cost per acquisition in nanoseconds.

    python bench/experiments/bench_lock.py
"""

from __future__ import annotations

import time

import torch

from ort_torch_train.state.training_state import TrainingState


def _per_iteration(body, iterations: int) -> float:
    start = time.perf_counter_ns()
    body(iterations)
    return (time.perf_counter_ns() - start) / iterations


def main(iterations: int = 1_000_000, repeats: int = 5) -> None:
    state = TrainingState({"w": torch.nn.Parameter(torch.zeros(2))})
    lock = state.lock

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def locked(n: int) -> None:
        for _ in range(n):
            with lock:
                pass

    costs = []
    for _ in range(repeats):  # interleaved, best of each
        costs.append(_per_iteration(locked, iterations) - _per_iteration(empty, iterations))
    print(
        f"uncontended RLock acquire+release: {min(costs):.0f} ns (median {sorted(costs)[repeats // 2]:.0f} ns, "
        f"{repeats} x {iterations} iterations; shared machine)"
    )


if __name__ == "__main__":
    main()
