"""``deepspeed_zero_stage`` 2 and 3 and ``horizontal_parallel_size`` for the legacy optimizers: their
kernels on the local shards.

The session's engine shards the trained weights with ``fully_shard`` (``distributed/fully_sharded.py``),
or the Megatron pairs' weights across the tensor-parallel ranks (``distributed/tensor_parallel_ranks.py``);
each rank runs the legacy SGD/Adam kernel on its shard of every sharded weight and on every whole one,
keeping those pieces' moments. Adam's kernel is element-wise given the global gradient norm, which the session computes over
every rank's gradient shards. Reading or loading the optimizer state gathers or cuts the whole
tensors: those calls are collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from ort_torch_train.distributed.local_shards import local_chunk
from ort_torch_train.errors import DistributedError
from ort_torch_train.legacy.moments import MOMENT_1, MOMENT_2, STATE_PREFIXES, state_tensors_of
from ort_torch_train.legacy.optimizers import InitialState, LegacyOptimizer


class FsdpLegacyOptimizer:
    """A legacy optimizer over this rank's shards of the trained weights, with the legacy optimizer's face."""

    def __init__(
        self,
        build: Callable[[Mapping[str, torch.nn.Parameter], InitialState], LegacyOptimizer],
        params: Mapping[str, torch.nn.Parameter],
        initial_state: InitialState,
    ) -> None:
        self.params: dict[str, torch.nn.Parameter] = {}
        pieces = {}
        for name, param in params.items():
            if param.grad is None:
                raise DistributedError(f"sharded legacy optimizer: weight {name!r} has no gradient")
            self.params[name] = param
            if not isinstance(param, DTensor):  # held whole on every rank
                pieces[name] = param
                continue
            piece = torch.nn.Parameter(param.to_local().detach(), requires_grad=False)  # the shard's storage
            piece.grad = param.grad.to_local()  # type: ignore[attr-defined]  # a DTensor gradient
            pieces[name] = piece
        cut = {
            weight: {key: self._cut(weight, key, value) for key, value in values.items()}
            for weight, values in initial_state.items()
            if weight in self.params
        }
        self.inner = build(pieces, cut)
        self.clip_grad_norm = self.inner.clip_grad_norm

    def step(self, learning_rate: float, grad_norm: Tensor | None = None) -> None:
        """Update this rank's shards (the global ``grad_norm`` computed over every rank's)."""
        self.inner.step(learning_rate, grad_norm)

    def optimizer_state(self) -> dict[str, dict[str, Tensor]]:
        """The whole state of every weight, gathered from the ranks' shards (a collective)."""
        whole: dict[str, dict[str, Tensor]] = {}
        for name, values in self.inner.optimizer_state().items():
            param = self.params[name]
            whole[name] = {
                key: (
                    DTensor.from_local(
                        value, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                    ).full_tensor()
                    if key in (MOMENT_1, MOMENT_2) and isinstance(param, DTensor)
                    else value
                )
                for key, value in values.items()
            }
        return whole

    def state_tensors(self) -> dict[str, Tensor]:
        """ORT's optimizer-state initializers, whole (a collective)."""
        return state_tensors_of(self.optimizer_state())

    def load_state_tensor(self, name: str, value: object) -> bool:
        """Load this rank's shard of one ``<prefix>_<weight>`` tensor; False when it is not a state tensor."""
        for prefix in STATE_PREFIXES:
            weight = name.removeprefix(prefix + "_")
            if weight != name and weight in self.params:
                return self.inner.load_state_tensor(name, self._cut(weight, prefix, value))
        return False

    def _cut(self, weight: str, key: str, value: object) -> object:
        """This rank's shard of a whole moment, after checking its shape; any other value is not cut."""
        param = self.params[weight]
        if key not in (MOMENT_1, MOMENT_2) or not isinstance(param, DTensor):
            return value
        tensor = value.detach() if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"{key} of {weight!r}: expected shape {list(param.shape)}, got {list(tensor.shape)}")
        return local_chunk(tensor, param)
