"""Data converted to a model input's dtype without silent narrowing: integers must fit the target's range,
and finite floats must stay finite (a float64 of 1e300 does not become a float32 inf)."""

from __future__ import annotations

import numpy as np

from ort_torch_train.errors import InputError


def checked_cast(array: np.ndarray, dtype: np.dtype | str, label: str) -> np.ndarray:
    """``array`` as ``dtype``; an InputError naming ``label``, the first value that does not fit and the
    dtype when a value would wrap, be cut or overflow to infinity."""
    target = np.dtype(dtype)
    if array.dtype == target:
        return array
    if target.kind in "iu" and array.dtype.kind in "iub" and array.size:
        info = np.iinfo(target)
        low, high = array.min(), array.max()
        if int(low) < info.min or int(high) > info.max:
            bad = low if int(low) < info.min else high
            raise InputError(
                f"{label} holds {int(bad)}, outside the range of {target.name} [{info.min}, {info.max}] "
                f"that the input takes: it would not convert exactly"
            )
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(target)
    if target.kind == "f" and array.dtype.kind in "fiu" and array.size:
        overflow = np.isinf(converted) & ~np.isinf(array) if array.dtype.kind == "f" else np.isinf(converted)
        if overflow.any():
            bad = array.reshape(-1)[int(np.argmax(overflow.reshape(-1)))]
            raise InputError(
                f"{label} holds {bad!r}, beyond the range of {target.name} that the input takes: it would become "
                "infinite"
            )
    return converted
