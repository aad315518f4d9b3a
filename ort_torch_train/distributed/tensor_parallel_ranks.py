"""What each rank of a tensor-parallel run holds, and how its gradients meet the other ranks'.

The paired weights of a ``TensorParallelPlan`` (the MLP pairs' and attention blocks' column- and
row-parallel weights, the column-parallel biases) become DTensors ``Shard(dim)`` over the tp ranks,
replacing the state's parameters: each rank keeps its slice of them, of their gradients (DTensor's
backward produces the shards: nothing is gathered) and of their moments (``local_shards.LocalShards``,
the optimizer kernels on the local pieces). Every other parameter stays whole on every rank; its
gradient is computed identically on every tp rank, so it is not averaged over them. The gradient clip
counts each shard once and each whole gradient once (``clip_grad_norm_``'s ``whole``). With data
parallel, at the end of each backward outside ``no_sync`` every gradient (whole, or this rank's shard)
is averaged over the ranks holding the same slice (the dp group), as DDP averages them.

A checkpoint save, an eval step and reading a parameter through the state gather the shards: each is a
collective that every rank calls (``local_shards.ShardedCheckpoint``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from ort_torch_train.distributed.data_parallel import DataParallel, GradientAverage
from ort_torch_train.distributed.layer_units import ZeroStandIns
from ort_torch_train.distributed.local_shards import ShardedCheckpoint, local_shard, sharded_optimizer_engine
from ort_torch_train.errors import DistributedError
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.state.training_state import TrainingState


class TensorParallelRanks(DataParallel):
    """A tensor-parallel run's strategy over ``state`` (see the module doc): ``sharded`` (parameter name ->
    the dimension cut) held as shards over ``mesh`` (the tp ranks); gradients averaged over
    ``data_parallel_group`` (None: one replica). ``group``: every rank (the checks that ranks agree)."""

    shards_parameters = True  # the paired weights are this rank's shards (DTensors)

    def __init__(
        self,
        graph: Any,
        state: TrainingState,
        names: Sequence[str],
        sharded: Mapping[str, int],
        mesh: DeviceMesh,
        data_parallel_group: Any,
        gradient_combination: str = "average",
    ) -> None:
        self.group = dist.group.WORLD
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if gradient_combination != "average":  # every rank, as the settings agree
            raise DistributedError(
                f"tensor_parallel_size={mesh.size()}: expected gradient_combination='average' for the data-parallel "
                f"replicas, got {gradient_combination!r}"
            )
        self.gradient_combination = gradient_combination
        self.synchronise = True
        self._mesh = mesh
        self._graph = graph
        with torch.no_grad():
            for name, dim in sharded.items():
                state.params[name] = _shard(state.params[name], mesh, dim)
        state.follow_parameters()
        self._params = [state.params[name] for name in names]
        self._stand_ins = ZeroStandIns(self._params)
        self._replicas = 1 if data_parallel_group is None else dist.get_world_size(data_parallel_group)
        self._average = None if self._replicas == 1 else GradientAverage(data_parallel_group, self._replicas)
        self._trainable = [param for param in self._params if param.requires_grad]
        self._pending = False  # a forward outside no_sync waits for its backward's average
        self._queued = False  # this backward's average is queued
        if self._average is not None:
            for param in self._trainable:
                param.register_post_accumulate_grad_hook(self._gradient_ready)
        self.checkpoint = ShardedCheckpoint(dist.group.WORLD)
        state.coordinate_saves(self.checkpoint)

    def __repr__(self) -> str:
        return f"TensorParallelRanks(tp={self._mesh.size()}, dp={self._replicas})"

    @property
    def shard_group(self) -> Any:
        """The tp ranks, whose shards together make each sharded parameter."""
        return self._mesh.get_group()

    @property
    def data_parallel_size(self) -> int:
        """How many replicas average their gradients (the dp group's size)."""
        return self._replicas

    def forward(self, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The training graph's outputs; their backward averages the gradients over the replicas unless in
        ``no_sync``."""
        module = self._graph.module_for(inputs, self._stand_ins)  # converted on whole-shaped examples
        outputs = tuple(module(*inputs, *self._params))
        self._pending = self._average is not None and self.synchronise and torch.is_grad_enabled()
        return outputs

    def release(self) -> None:
        """Nothing to free: no reducer."""

    def compiled_reduction(self) -> None:
        """Never asked for: tensor parallel runs eager steps."""
        raise DistributedError("tensor parallel: a step does not run as one compiled graph")

    def optimizer_engine(self, engine: type[OptimizerEngine], **arguments: Any) -> OptimizerEngine:
        """An optimizer engine (built as ``engine(**arguments, tensors=...)``) whose kernels run on this rank's
        shards and whole parameters, and whose checkpoints save the moments gathered from the tp ranks."""
        return sharded_optimizer_engine(engine, self.checkpoint, self.shard_group, **arguments)

    def _gradient_ready(self, _param: Tensor) -> None:
        if self._pending and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._average_gradients)

    def _average_gradients(self) -> None:
        """Average every gradient (this rank's piece) over the replicas, in place (at a backward's end)."""
        self._pending = self._queued = False
        average = self._average
        grads = [local_shard(param.grad) for param in self._trainable if param.grad is not None]
        if average is not None and grads:
            with torch.no_grad():
                torch._foreach_copy_(grads, average(grads))


def _shard(param: Tensor, mesh: DeviceMesh, dim: int) -> nn.Parameter:
    """``param`` as this rank's ``Shard(dim)`` of ``mesh`` (its own storage: the whole tensor can go), with a
    zero gradient when it is trained."""
    if isinstance(param, DTensor):
        raise DistributedError(f"tensor parallel: a parameter of shape {tuple(param.shape)} is sharded already")
    piece = torch.chunk(param.detach(), mesh.size(), dim=dim)[mesh.get_local_rank()]
    local = piece.clone(memory_format=torch.contiguous_format)
    sharded = nn.Parameter(DTensor.from_local(local, mesh, [Shard(dim)], run_check=False), param.requires_grad)
    if param.requires_grad:
        sharded.grad = torch.zeros_like(sharded)
    return sharded
