"""What the legacy AdamOptimizer and LambOptimizer share: per-weight attributes over the schema
defaults, the gradient clip by the global norm, and the state ORT keeps as initializers
``Moment_1_<w>``, ``Moment_2_<w>`` (zeros) and ``Update_Count_<w>`` (int64[1], counting from 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Generic, TypeAlias, TypeVar, get_type_hints

import numpy as np
import torch
from torch import Tensor

from ort_torch_train.optim.float32 import to_float32

UPDATE_COUNT, MOMENT_1, MOMENT_2 = "Update_Count", "Moment_1", "Moment_2"
STATE_PREFIXES = (UPDATE_COUNT, MOMENT_1, MOMENT_2)

NON_NEGATIVE_ATTRIBUTES = ("alpha", "beta", "lambda", "epsilon")

Attributes = TypeVar("Attributes", bound="NodeAttributes")
InitialState: TypeAlias = Mapping[str, Mapping[str, object]]  # {weight: {state prefix: value}}


def state_tensors_of(optimizer_state: Mapping[str, Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """ORT's optimizer-state initializers (``<prefix>_<weight>``) of ``get_optimizer_state()``'s content."""
    return {
        f"{prefix}_{weight}": value for weight, values in optimizer_state.items() for prefix, value in values.items()
    }


@dataclass(frozen=True)
class NodeAttributes:
    """The attributes every legacy moment optimizer's node has (floats rounded to float32)."""

    alpha: float
    beta: float
    lambda_: float
    epsilon: float
    max_norm_clip: float


def node_attributes(
    kind: type[Attributes],
    op_type: str,
    weight: str,
    floats: Mapping[str, float],
    ints: Mapping[str, int],
    float_defaults: Mapping[str, float],
    int_defaults: Mapping[str, int],
) -> Attributes:
    """The attributes of ``weight``'s ``op_type`` node over the defaults as a ``kind`` (its fields
    named as the attributes; unknown names left out), checked like ORT's kernel constructors: alpha,
    beta, lambda and epsilon non-negative, every int attribute 0 or 1."""
    values: dict[str, float] = {name: to_float32(value) for name, value in float_defaults.items()}
    values.update({name: to_float32(value) for name, value in floats.items() if name in float_defaults})
    values.update(int_defaults)
    values.update({name: int(value) for name, value in ints.items() if name in int_defaults})
    for name in NON_NEGATIVE_ATTRIBUTES:
        if not values[name] >= 0:
            raise ValueError(f"{op_type} for weight {weight!r}: attribute {name} must be >= 0, got {values[name]}")
    for name in int_defaults:
        if values[name] not in (0, 1):
            raise ValueError(f"{op_type} for weight {weight!r}: attribute {name} must be 0 or 1, got {values[name]}")
    types = get_type_hints(kind)
    return kind(**{field.name: types[field.name](values[field.name.rstrip("_")]) for field in fields(kind)})


def clip_divisor(grad_norm: Tensor, max_norm_clip: float) -> Tensor:
    """What the gradients are divided by: ``norm / max_norm_clip`` when the global norm exceeds it, else 1."""
    return torch.where(grad_norm > max_norm_clip, grad_norm / max_norm_clip, torch.ones_like(grad_norm))


class PerWeightMoments(Generic[Attributes]):
    """Two moments and an update count per trained weight, with ORT's names for loading and saving them.

    ``attributes`` holds each weight's node attributes; ``fp16_moments`` stores the moments in float16.
    """

    def __init__(
        self,
        params: Mapping[str, torch.nn.Parameter],
        attributes: Mapping[str, Attributes],
        initial_state: InitialState,
        clip_grad_norm: bool,
        fp16_moments: bool = False,
    ) -> None:
        self.params = dict(params)
        self.attributes = dict(attributes)
        self.clip_grad_norm = clip_grad_norm
        self.update_counts = {name: 1 for name in self.params}
        dtype = torch.float16 if fp16_moments else None
        self.moments = {
            name: (torch.zeros_like(p.detach(), dtype=dtype), torch.zeros_like(p.detach(), dtype=dtype))
            for name, p in self.params.items()
        }
        for weight, values in initial_state.items():
            if weight in self.params:
                for prefix in STATE_PREFIXES:
                    if prefix in values:
                        self._load(weight, prefix, values[prefix], "set_optimizer_initial_state")

    def state_tensors(self) -> dict[str, Tensor]:
        """ORT's optimizer-state initializers: ``Moment_1_<w>``, ``Moment_2_<w>``, ``Update_Count_<w>``."""
        return state_tensors_of(self.optimizer_state())

    def optimizer_state(self) -> dict[str, dict[str, Tensor]]:
        """``{weight: {"Moment_1": m, "Moment_2": v, "Update_Count": int64[1]}}`` (live moments)."""
        return {
            weight: {
                MOMENT_1: m1,
                MOMENT_2: m2,
                UPDATE_COUNT: torch.tensor([self.update_counts[weight]], dtype=torch.int64),
            }
            for weight, (m1, m2) in self.moments.items()
        }

    def load_state_tensor(self, name: str, value: object) -> bool:
        """Load one ``<prefix>_<weight>`` tensor; False when ``name`` is not an optimizer-state tensor."""
        for prefix in STATE_PREFIXES:
            weight = name.removeprefix(prefix + "_")
            if weight != name and weight in self.params:
                self._load(weight, prefix, value, "load_state")
                return True
        return False

    def _clip_norm(self, grad_norm: Tensor | None) -> Tensor | None:
        """``grad_norm`` when gradient clipping is on (then it is required), else None."""
        if not self.clip_grad_norm:
            return None
        if grad_norm is None:
            raise ValueError(
                f"{type(self).__name__}.step: gradient clipping is enabled but no global gradient norm was given"
            )
        return grad_norm

    def _load(self, weight: str, prefix: str, value: object, where: str) -> None:
        tensor = torch.as_tensor(np.asarray(value)) if not isinstance(value, Tensor) else value.detach()
        if prefix == UPDATE_COUNT:
            _check(tensor, torch.int64, (1,), f"{where}: {prefix} of {weight!r}")
            self.update_counts[weight] = int(tensor.reshape(()))
            return
        moment = self.moments[weight][0 if prefix == MOMENT_1 else 1]
        _check(tensor, moment.dtype, tuple(moment.shape), f"{where}: {prefix} of {weight!r}")
        with torch.no_grad():
            moment.copy_(tensor)


def _check(tensor: Tensor, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> None:
    if tensor.dtype != dtype or tuple(tensor.shape) != shape:
        raise ValueError(
            f"{what}: expected {str(dtype).removeprefix('torch.')} of shape {list(shape)}, "
            f"got {str(tensor.dtype).removeprefix('torch.')} of shape {list(tensor.shape)}"
        )
