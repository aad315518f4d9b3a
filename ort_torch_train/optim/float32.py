"""Float32 rounding of Python scalars, for reproducing ORT's float arithmetic on the host."""

import numpy as np


def to_float32(value: float) -> float:
    """Return ``value`` rounded to the nearest float32, as a Python float."""
    return float(np.float32(value))
