"""A batch as the model's inputs, whatever its container: a sequence, a mapping by input name (as
``datasets``' ``with_format("torch")`` gives), or a single array."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ort_torch_train.errors import InputError


def model_inputs(batch: Any, names: list[str]) -> list[Any]:
    """A batch as the model's inputs in order: a sequence as is, a mapping by input name."""
    if isinstance(batch, Mapping):
        missing = [name for name in names if name not in batch]
        if missing:
            raise InputError(f"batch: no value for input {missing[0]!r} (the batch holds {', '.join(map(str, batch))})")
        return [batch[name] for name in names]
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return [batch]
    return list(batch)
