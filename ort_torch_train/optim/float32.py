"""Float32 rounding of Python scalars, for reproducing ORT's float arithmetic on the host."""

import struct

import numpy as np

_FLOAT32 = struct.Struct("f")


def to_float32(value: float) -> float:
    """Return ``value`` rounded to the nearest float32, as a Python float."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]  # a C float cast (cheaper than numpy's)
    except OverflowError:  # finite beyond float32's range: numpy's cast gives the infinity ORT's does
        return float(np.float32(value))
