"""``deepspeed_zero_stage=1`` for the legacy optimizers: state sharded element-wise across the ranks.

The same partition as ``Optimizer(shard_state=True)`` (``distributed/zero.py``): each rank runs the
legacy SGD/Adam kernel on its contiguous slice of the flattened trained weights, keeping only that
slice's moments, then one all_gather writes every updated weight back. Adam's kernel is element-wise
given the global gradient norm, which the session computes from the averaged gradients. Reading or
loading the optimizer state gathers or cuts the whole tensors: those calls are collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from ort_torch_train.distributed.data_parallel import DataParallel
from ort_torch_train.distributed.zero import FlatShard
from ort_torch_train.errors import DistributedError
from ort_torch_train.legacy.moments import MOMENT_1, MOMENT_2, STATE_PREFIXES, UPDATE_COUNT, state_tensors_of
from ort_torch_train.legacy.optimizers import InitialState, LegacyOptimizer, build_optimizer
from ort_torch_train.legacy.parameters import TrainingParameters
from ort_torch_train.optim.tensor_lists import gradient_buffers

if TYPE_CHECKING:
    from ort_torch_train.legacy.sharded import FsdpLegacyOptimizer


def build_legacy_optimizer(
    parameters: TrainingParameters,
    params: Mapping[str, torch.nn.Parameter],
    data_parallel: DataParallel | None,
) -> LegacyOptimizer | ShardedLegacyOptimizer | FsdpLegacyOptimizer | None:
    """The optimizer ``parameters`` name over the trained ``params``; under ZeRO stage 1 in a
    data-parallel run, over this rank's slice of them. None for no optimizer name or no trained weight."""

    def build(weights: Mapping[str, torch.nn.Parameter], initial_state: InitialState) -> LegacyOptimizer:
        return build_optimizer(
            parameters.training_optimizer_name,
            weights,
            parameters.optimizer_attributes_map,
            parameters.optimizer_int_attributes_map,
            initial_state,
            parameters.enable_grad_norm_clip,
            parameters.use_fp16_moments,
            all_weights=list(params),
        )

    if not parameters.training_optimizer_name or not params:
        return None  # ORT then builds no optimizer graph, and takes no learning rate
    if data_parallel is not None and data_parallel.shards_parameters:  # stages 2 and 3 (FSDP2), tensor parallel
        if parameters.deepspeed_zero_stage == 1 and data_parallel.data_parallel_size > 1:
            raise DistributedError(
                "TrainingParameters.deepspeed_zero_stage = 1 with horizontal_parallel_size = "
                f"{parameters.horizontal_parallel_size} and {data_parallel.data_parallel_size} data-parallel "
                "replicas: the split weights' moments are sharded already; expected deepspeed_zero_stage = 0"
            )
        from ort_torch_train.legacy.sharded import FsdpLegacyOptimizer  # DTensor: loaded by sharded runs only

        return FsdpLegacyOptimizer(build, params, parameters.optimizer_initial_state)
    if parameters.deepspeed_zero_stage == 0 or data_parallel is None:
        return build(params, parameters.optimizer_initial_state)
    return ShardedLegacyOptimizer(build, params, parameters.optimizer_initial_state, data_parallel.group)


class ShardedLegacyOptimizer:
    """A legacy optimizer over this rank's slice of the trained weights, with the legacy optimizer's face."""

    def __init__(
        self,
        build: Callable[[Mapping[str, torch.nn.Parameter], InitialState], LegacyOptimizer],
        params: Mapping[str, torch.nn.Parameter],
        initial_state: InitialState,
        group: Any,
    ) -> None:
        self.params = dict(params)
        self.shard = FlatShard([p.numel() for p in self.params.values()], group)
        names = list(self.params)
        self._slices = {names[index]: (start, stop) for index, start, stop in self.shard.pieces}
        if not self._slices:
            raise DistributedError(
                f"TrainingParameters.deepspeed_zero_stage = 1: rank {self.shard.rank} of "
                f"{self.shard.world_size} owns no element of the {sum(self.shard.numels)} "
                "trained ones; use fewer ranks or stage 0"
            )
        pieces = {}
        for name, (start, stop) in self._slices.items():
            param = self.params[name]
            (grad,) = gradient_buffers([param])
            piece = torch.nn.Parameter(param.detach().view(-1)[start:stop], requires_grad=False)
            piece.grad = grad.view(-1)[start:stop]  # views: the session's gradients, averaged in place
            pieces[name] = piece
        cut = {
            weight: {key: self._cut(weight, key, value) for key, value in values.items()}
            for weight, values in initial_state.items()
            if weight in self.params
        }  # checked on every rank
        owned_state = {weight: values for weight, values in cut.items() if weight in self._slices}
        self.inner = build(pieces, owned_state)
        self.clip_grad_norm = self.inner.clip_grad_norm
        self._wholes = [param.detach().view(-1) for param in self.params.values()]

    def step(self, learning_rate: float, grad_norm: Tensor | None = None) -> None:
        """Update this rank's slice, then gather every rank's (a collective)."""
        self.inner.step(learning_rate, grad_norm)
        with torch.no_grad():
            self.shard.gather_into(self._wholes, [piece.detach() for piece in self.inner.params.values()])

    def optimizer_state(self) -> dict[str, dict[str, Tensor]]:
        """The whole state of every weight, gathered from the ranks' slices (a collective)."""
        owned = self.inner.optimizer_state()
        if not owned:  # SGD: no state
            return {}
        whole: dict[str, dict[str, Tensor]] = {name: {} for name in self.params}
        for key in (MOMENT_1, MOMENT_2):
            pieces = [owned[name][key] for name in self._slices]
            for name, tensor in zip(self.params, self.shard.gather(pieces, pieces[0])):
                whole[name][key] = tensor.view(self.params[name].shape)
        counts = torch.tensor(
            [int(owned[name][UPDATE_COUNT]) if name in owned else 0 for name in self.params], device=pieces[0].device
        )  # NCCL: a CUDA tensor
        dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=self.shard.group)
        for name, count in zip(self.params, counts.tolist()):
            whole[name][UPDATE_COUNT] = torch.tensor([count], dtype=torch.int64)
        return whole

    def state_tensors(self) -> dict[str, Tensor]:
        """ORT's optimizer-state initializers, whole (a collective)."""
        return state_tensors_of(self.optimizer_state())

    def load_state_tensor(self, name: str, value: object) -> bool:
        """Load this rank's slice of one ``<prefix>_<weight>`` tensor; False when it is not a state tensor."""
        if not hasattr(self.inner, "moments"):  # SGD: no state tensor
            return False
        for prefix in STATE_PREFIXES:
            weight = name.removeprefix(prefix + "_")
            if weight != name and weight in self.params:
                piece = self._cut(weight, prefix, value)  # checked on every rank
                return weight not in self._slices or self.inner.load_state_tensor(name, piece)
        return False

    def _cut(self, weight: str, key: str, value: object) -> object:
        """This rank's slice of a whole moment, after checking its shape (None where this rank owns
        none of the weight); an update count (or any other value) is not sliced."""
        if key not in (MOMENT_1, MOMENT_2):
            return value
        tensor = value.detach() if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
        shape = tuple(self.params[weight].shape)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{key} of {weight!r}: expected shape {list(shape)}, got {list(tensor.shape)}")
        if weight not in self._slices:
            return None
        start, stop = self._slices[weight]
        return tensor.reshape(-1)[start:stop]
