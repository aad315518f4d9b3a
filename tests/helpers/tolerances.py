"""Comparisons of two computations of one sum, at a tolerance derived from the size of its terms.

Two float32 computations of a sum (another reduction order, another kernel, another thread count)
differ by a few units in the last place of the largest partial sums, not of the result: a result
that cancels (small against its terms) differs by much more than a relative tolerance on it allows.
"""

from __future__ import annotations

import numpy as np
import torch

ArrayLike = np.ndarray | torch.Tensor


def assert_close_to_terms(actual: ArrayLike, expected: ArrayLike, terms: ArrayLike, rtol: float) -> None:
    """``|actual - expected| <= rtol * terms`` element by element, ``terms`` being the sum of the absolute
    values of the terms each element of ``expected`` sums (broadcast to its shape)."""
    got, want, size = (np.asarray(torch.as_tensor(t).detach().cpu().double()) for t in (actual, expected, terms))
    assert got.shape == want.shape, f"shapes differ: {got.shape} against {want.shape}"
    bound = rtol * np.broadcast_to(size, want.shape)
    error = np.abs(got - want)
    bad = ~(error <= bound)
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, error / np.maximum(bound, 1e-300), 0)), want.shape)
        raise AssertionError(
            f"{int(bad.sum())} of {want.size} elements differ by more than {rtol} x the sum of their terms' "
            f"absolute values; worst at {tuple(map(int, worst))}: {got[worst]!r} against {want[worst]!r} "
            f"(difference {error[worst]:.3g}, terms {np.broadcast_to(size, want.shape)[worst]:.3g})"
        )
