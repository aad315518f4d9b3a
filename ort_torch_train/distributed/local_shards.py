"""Training state held as DTensor shards: the optimizer kernels on the local shards, and the saves that
gather them. One mechanism for FSDP2 (``fully_sharded.py``: every parameter ``Shard(0)`` over the
data-parallel group) and tensor parallel (``tensor_parallel_ranks.py``: the paired weights ``Shard(0)``
or ``Shard(1)`` over the tp ranks, the other parameters whole on every rank).

A sharded parameter of the state is a DTensor whose gradient is a DTensor of the same placements; a
whole one is a plain tensor. Each rank keeps the moments of its local pieces: a sharded parameter's
are cut from a checkpoint's whole ones as the parameter is cut, and gathered again for a save.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard

from ort_torch_train.distributed.checkpoint import DistributedCheckpoint
from ort_torch_train.errors import CheckpointError, DistributedError
from ort_torch_train.optim.algorithm import OptimizerAlgorithm
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.tensor_lists import KernelTensors, optimizer_group
from ort_torch_train.state.training_state import TrainingState


class LocalShards:
    """An OptimizerEngine's tensor provider over sharded (and whole) parameters: their local pieces, those
    of their gradients, and this rank's pieces of the moments (cut from a checkpoint's whole ones).
    ``group``: the ranks whose shards together make every sharded parameter (the gradient norm's)."""

    fuses_into_step = False

    def __init__(self, group: Any) -> None:
        self.group = group
        self._moments: dict[str, list[tuple[str, Tensor]]] = {}  # stored moment name -> (parameter, local piece)
        self._whole: list[bool] = []  # per kernel tensor: held whole on every rank (not sharded)

    def kernel_tensors(
        self, state: TrainingState, param_names: Sequence[str], algorithm: OptimizerAlgorithm
    ) -> KernelTensors:
        """The local pieces (``TensorProvider``)."""
        if not algorithm.elementwise:
            raise DistributedError(
                f"sharded parameters: {algorithm.display_name}'s update is not element-wise, so it cannot run on shards"
            )
        params = [_trainable(state, name) for name in param_names]
        momentums = optimizer_group(state).momentums
        with torch.no_grad():
            local_params = [param.to_local() if isinstance(param, DTensor) else param.detach() for param in params]
            local_grads = [local_shard(param.grad) for param in params]  # type: ignore[arg-type]  # checked
            owned = {}
            for name, param, local in zip(param_names, params, local_params):
                if not momentums:  # zeros, as in ORT
                    owned[name] = {key: torch.zeros_like(local) for key in algorithm.stored_moments}
                else:
                    owned[name] = _local_moments(name, param, local, momentums.get(name), algorithm.stored_moments)
        state.set_moments(owned, only=True)
        self._moments = {
            key: [(name, momentums[name][key]) for name in param_names] for key in algorithm.stored_moments
        }
        self._whole = [not isinstance(param, DTensor) for param in params]
        return KernelTensors(
            local_params,
            local_grads,
            [[momentums[name][key] for name in param_names] for key in algorithm.updated_moments],
        )

    def clip_gradients(self, grads: list[Tensor], max_norm: float) -> None:
        """Clip by the norm of every rank's shards together (one all-reduce), whole gradients counted once."""
        clip_grad_norm_(grads, max_norm, group=self.group, whole=None if not any(self._whole) else self._whole)

    def after_step(self, tensors: KernelTensors) -> None:
        """Nothing: the local pieces are the parameters'."""

    def gathered_momentums(self, engine: OptimizerEngine) -> dict[str, dict[str, Tensor]]:
        """Every parameter's whole moments, gathered from the ranks' shards. A collective."""
        full: dict[str, dict[str, Tensor]] = {name: {} for name in engine.param_names}
        with torch.no_grad():
            for key, pieces in self._moments.items():
                for name, local in pieces:
                    param = _trainable(engine.state, name)
                    if not isinstance(param, DTensor):
                        full[name][key] = local
                        continue
                    whole = DTensor.from_local(
                        local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                    )
                    full[name][key] = whole.full_tensor()
        return full


class ShardedCheckpoint(DistributedCheckpoint):
    """Saves a sharded run's checkpoint: a collective (every rank gathers the parameters and moments), then
    rank 0 writes what one process writes."""

    def gathered(
        self, state: TrainingState, target: str, include_optimizer_state: bool, counted: bool = False
    ) -> tuple[dict[str, Tensor] | None, dict[str, dict[str, Tensor]] | None]:
        """The whole parameters and (``include_optimizer_state``) moments, gathered from every rank."""
        if not counted:
            self._await_every_rank(target)
        with self._failures(target, "gathering the sharded parameters"), torch.no_grad():
            params = {name: whole_value(param) for name, param in state.params.items()}
        _, moments = super().gathered(state, target, include_optimizer_state, counted=True)
        return params, moments


def sharded_optimizer_engine(
    engine: type[OptimizerEngine], checkpoint: DistributedCheckpoint, group: Any, **arguments: Any
) -> OptimizerEngine:
    """An optimizer engine (``engine(**arguments, tensors=...)``) whose kernels run on the local pieces
    (``LocalShards`` over ``group``), its moments gathered for ``checkpoint``'s saves."""
    shards = LocalShards(group)
    built = engine(**arguments, tensors=shards)
    checkpoint.gather_moments_from(built, shards)
    return built


def whole_value(param: Tensor) -> Tensor:
    """A parameter's whole value (gathered when sharded: a collective)."""
    return param.full_tensor() if isinstance(param, DTensor) else param.detach()


def local_shard(tensor: Tensor) -> Tensor:
    """A sharded tensor's local shard (the same storage), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_chunk(whole: Tensor, param: DTensor) -> Tensor:
    """This rank's piece of ``whole`` (a tensor of ``param``'s shape), cut as ``param`` is cut (chunks along
    its one ``Shard`` dimension of a 1-D mesh, as FSDP2 and tensor parallel cut): a copy."""
    mesh = param.device_mesh
    (placement,) = param.placements
    dim = placement.dim if isinstance(placement, Shard) else 0
    chunks = torch.chunk(whole.detach(), mesh.size(), dim=dim)
    rank = mesh.get_local_rank()
    if rank < len(chunks):
        piece = chunks[rank]
    else:
        shape = list(whole.shape)
        shape[dim] = 0
        piece = whole.new_zeros(shape)
    return piece.clone(memory_format=torch.contiguous_format).view(param.to_local().shape)


def _trainable(state: TrainingState, name: str) -> Tensor:
    param = state.params.get(name)
    if param is None or param.grad is None:
        raise DistributedError(f"sharded parameters: parameter {name!r} is not a trainable parameter of this state")
    return param


def _local_moments(
    name: str, param: Tensor, local: Tensor, moments: dict[str, Tensor] | None, keys: Sequence[str]
) -> dict[str, Tensor]:
    """This rank's piece of a parameter's moments: kept, or cut from a checkpoint's whole ones as the
    parameter is cut."""
    if moments is None:
        raise CheckpointError(f"Parameter {name} not found in the source optimizer checkpoint states.")
    owned = {}
    for key in keys:
        moment = moments.get(key)
        if moment is not None and moment.shape == local.shape and moment.dtype == local.dtype:
            owned[key] = moment
            continue
        if moment is None or moment.shape != param.shape or moment.dtype != param.dtype:
            found = "nothing" if moment is None else f"{moment.dtype} of shape {tuple(moment.shape)}"
            raise CheckpointError(
                f"optimizer state {name!r}/{key!r}: expected {param.dtype} of shape {tuple(param.shape)}; found {found}"
            )
        assert isinstance(param, DTensor)  # a whole parameter's moment has its shape, kept above
        owned[key] = local_chunk(moment.to(local.device), param)
    return owned
