"""Sharded training on FSDP2 (``torch.distributed.fsdp.fully_shard``): ZeRO-2 and ZeRO-3.

``Module(..., sharding="zero2"|"zero3")``. The training graph is cut into per-layer units and a unit of
the parameters layers share (``layer_units.py``); each unit, then the root (holding shared parameters
that no unit can), goes through ``fully_shard`` over the data-parallel group. Every rank then keeps dim-0 shards of the parameters
(DTensors, which replace the state's parameters), of their gradients (reduce-scattered, averaged) and
of the optimizer's moments. A unit's parameters are gathered before its part of the forward; "zero3"
frees them after it and gathers them again for its backward (``reshard_after_forward=True``), "zero2"
keeps them until its backward is done. The optimizer kernels run on the local shards
(``LocalShards``); the gradient clip uses the norm of every rank's shards together. A checkpoint save
is a collective: every rank gathers the whole parameters and moments and rank 0 writes the same ODTC
bytes one process writes (``ShardedCheckpoint``). Reading a parameter through the state gathers it
(``TrainingState.parameter``). Recompute (``layer_units.UnitRecompute``): with ``each_unit`` each unit's
activations are recomputed in its backward, eager or compiled; with ``whole_layers`` (a legacy session's
transformer layers) each numbered layer is one unit, so that a layer's recomputed region gathers its
parameters at once. Mixed precision is the engine's autocast around the sharded forward: the
parameters, their gradients and the moments stay float32, and fp16's loss scaler unscales the local
gradient shards, the ranks agreeing on a skip. A compiled sharded step (given a ``compiler``) compiles
each unit's stretch of the graph on its own (``LayeredGraph``'s compiler) after the compiled graph rewrites,
the checkpoint inside the compiled stretch with recompute;
FSDP2's gathers, reduce-scatters and the optimizer update on the local shards stay eager around them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, cast
from weakref import WeakKeyDictionary

import torch
import torch.distributed as dist
from torch import Tensor, fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ort_torch_train.distributed.checkpoint import DistributedCheckpoint
from ort_torch_train.distributed.data_parallel import DataParallel, require_identical
from ort_torch_train.distributed.layer_units import LayeredGraph, LayerPlan, Unit, UnitRecompute, ZeroStandIns
from ort_torch_train.errors import CheckpointError, DistributedError
from ort_torch_train.optim.algorithm import OptimizerAlgorithm
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.tensor_lists import KernelTensors, optimizer_group
from ort_torch_train.state.training_state import TrainingState

SHARDINGS = ("zero2", "zero3")


def check_sharding(sharding: object) -> str | None:
    """``sharding`` checked: None (off), "zero2" or "zero3"."""
    if sharding is None or sharding in SHARDINGS:
        return sharding
    raise ValueError(f"sharding: expected None, 'zero2' or 'zero3'; got {sharding!r}")


class _ShardedRoot(nn.Module):
    """The training graph over per-layer units: ``fully_shard`` applies to each unit, then to this root.
    With a ``compiler`` each unit's partitions run compiled; with ``recompute`` checkpointed."""

    def __init__(
        self,
        graph: Any,
        plan: LayerPlan,
        params: Sequence[nn.Parameter],
        user_inputs: int,
        recompute: bool,
        compiler: Callable[[fx.GraphModule], Callable] | None = None,
    ) -> None:
        super().__init__()
        unit_of = [plan.unit_of(i) for i in range(len(params))]
        self.units = nn.ModuleList(
            Unit([p for p, k in zip(params, unit_of) if k == unit]) for unit in range(plan.unit_count)
        )
        self._recompute = recompute
        self.shared = nn.ParameterList([p for p, k in zip(params, unit_of) if k is None])  # held by the root
        self._graph = [graph]  # a list: the graph stays out of the module tree
        self._plan = plan
        self._user_inputs = user_inputs
        self._stand_ins = ZeroStandIns(params)
        self._compiler = compiler
        self._layered: WeakKeyDictionary[Any, LayeredGraph] = WeakKeyDictionary()

    def forward(self, inputs: list[Tensor]) -> tuple[Tensor, ...]:
        graph = self._graph[0]
        if self._compiler is None:
            module = graph.module_for(inputs, self._stand_ins)
        else:  # the compiled graph rewrites, then each partition compiled (per input signature, as graph caches)
            module = graph.specialised(inputs, self._stand_ins, "sharded", graph.compiled_module, dynamic=False)
        layered = self._layered.get(module)
        if layered is None:
            units = [cast(Unit, unit) for unit in self.units]
            layered = self._layered[module] = LayeredGraph(
                module, self._plan, units, self._user_inputs, self._compiler, self._recompute
            )
        shared = iter(self.shared)
        unit_of = [self._plan.unit_of(i) for i in range(len(self._plan.owner))]
        return layered(*inputs, *(next(shared) if unit is None else None for unit in unit_of))

    def sharded_parameters(self) -> list[nn.Parameter]:
        """The parameters, sharded, in the graph's order."""
        per_unit = [iter(cast(Unit, unit).params) for unit in self.units]
        shared = iter(self.shared)
        unit_of = [self._plan.unit_of(i) for i in range(len(self._plan.owner))]
        return [next(shared) if unit is None else next(per_unit[unit]) for unit in unit_of]


class FullyShardedParallel(DataParallel):
    """ZeRO-2 ("zero2") or ZeRO-3 ("zero3") over the ranks of ``group`` for a training graph over ``state``'s
    parameters ``names`` (see the module doc); the state's parameters become their shards. ``recompute``:
    what the units recompute (``UnitRecompute``). ``compiler``: what compiles each unit's partitions
    (None: eager)."""

    shards_parameters = True  # the state's parameters are this rank's shards (DTensors)

    def __init__(
        self,
        graph: Any,
        state: TrainingState,
        names: Sequence[str],
        group: Any,
        sharding: str,
        recompute: UnitRecompute = UnitRecompute(),
        compiler: Callable[[fx.GraphModule], Callable] | None = None,
    ) -> None:
        self.group = group
        self.sharding = sharding
        self.gradient_combination = "average"
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.synchronise = True
        plan = LayerPlan.of(graph.graph, names, recompute.whole_layers)
        device = state.device
        _require_same_settings([sharding, recompute, compiler is not None, plan], group, device)
        require_identical({name: state.params[name] for name in names}, group, "parameters")
        scalars = [name for name in names if state.params[name].dim() == 0]
        if scalars:  # every rank, as the settings and parameters agree
            raise DistributedError(
                f"sharding={sharding!r}: FSDP2 shards parameters along their first axis; the model's "
                f"parameters {scalars[:3]} are scalars (0-d): train it without sharding (distributed=True)"
            )
        mesh = DeviceMesh.from_group(group, device.type)
        params = [state.params[name] for name in names]
        root = _ShardedRoot(graph, plan, params, len(graph.layout.user_inputs), recompute.each_unit, compiler)
        for unit in root.units:
            fully_shard(unit, mesh=mesh, reshard_after_forward=sharding == "zero3")
        self._root: FSDPModule | None = fully_shard(root, mesh=mesh, reshard_after_forward=False)
        self.plan = plan
        for name, param in zip(names, root.sharded_parameters()):
            if param.requires_grad:
                param.grad = torch.zeros_like(param)  # FSDP2 accumulates into it; the engine zeroes it in place
            state.params[name] = param
        state.follow_parameters()
        self.checkpoint = ShardedCheckpoint(group)
        state.coordinate_saves(self.checkpoint)

    def forward(self, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The training graph's outputs; their backward reduce-scatters the gradients unless in ``no_sync``."""
        root = self._root
        if root is None:
            raise DistributedError("sharded step after the process's exit began (the sharded module is released)")
        root.set_requires_gradient_sync(self.synchronise)
        return root(list(inputs))  # type: ignore[operator]  # an nn.Module

    @property
    def sharded_module(self) -> nn.Module | None:
        """The root module that ``fully_shard`` wraps, its per-layer units inside (None once released)."""
        return self._root  # type: ignore[return-value]  # an FSDPModule is an nn.Module

    def release(self) -> None:
        """Drop the sharded module (no step runs after it)."""
        self._root = None

    def compiled_reduction(self) -> None:
        """Never asked for: a compiled sharded step is no one-graph step (``EngineOptions.compiles_whole_step``)."""
        raise DistributedError("sharding: a sharded step does not run as one compiled graph")

    def optimizer_engine(self, engine: type[OptimizerEngine], **arguments: Any) -> OptimizerEngine:
        """An optimizer engine (built as ``engine(**arguments, tensors=...)``) whose kernels run on this rank's
        shards and whose checkpoints save the moments gathered from every rank."""
        shards = LocalShards(self.group)
        built = engine(**arguments, tensors=shards)
        self.checkpoint.gather_moments_from(built, shards)
        return built


class LocalShards:
    """An OptimizerEngine's tensor provider over sharded parameters: their local shards, those of their
    gradients, and this rank's shards of the moments (cut from a checkpoint's whole ones)."""

    fuses_into_step = False

    def __init__(self, group: Any) -> None:
        self.group = group
        self._moments: dict[str, list[tuple[str, Tensor]]] = {}  # stored moment name -> (parameter, local shard)

    def kernel_tensors(
        self, state: TrainingState, param_names: Sequence[str], algorithm: OptimizerAlgorithm
    ) -> KernelTensors:
        """The local shards (``TensorProvider``)."""
        if not algorithm.elementwise:
            raise DistributedError(
                f"sharding: {algorithm.display_name}'s update is not element-wise, so it cannot run on shards"
            )
        params = [_sharded(state, name) for name in param_names]
        momentums = optimizer_group(state).momentums
        with torch.no_grad():
            local_params = [param.to_local() for param in params]
            local_grads = [param.grad.to_local() for param in params]  # type: ignore[union-attr]  # made at sharding
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
        return KernelTensors(
            local_params,
            local_grads,
            [[momentums[name][key] for name in param_names] for key in algorithm.updated_moments],
        )

    def clip_gradients(self, grads: list[Tensor], max_norm: float) -> None:
        """Clip by the norm of every rank's shards together (one all-reduce)."""
        clip_grad_norm_(grads, max_norm, group=self.group)

    def after_step(self, tensors: KernelTensors) -> None:
        """Nothing: the local shards are the parameters'."""

    def gathered_momentums(self, engine: OptimizerEngine) -> dict[str, dict[str, Tensor]]:
        """Every parameter's whole moments gathered from the ranks' shards. A collective."""
        full: dict[str, dict[str, Tensor]] = {name: {} for name in engine.param_names}
        with torch.no_grad():
            for key, shards in self._moments.items():
                for name, local in shards:
                    param = _sharded(engine.state, name)
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
            params = {name: _whole(param) for name, param in state.params.items()}
        _, moments = super().gathered(state, target, include_optimizer_state, counted=True)
        return params, moments


def _whole(param: Tensor) -> Tensor:
    """A parameter's whole value (gathered when sharded: a collective)."""
    return param.full_tensor() if isinstance(param, DTensor) else param.detach()


def _sharded(state: TrainingState, name: str) -> DTensor:
    param = state.params.get(name)
    if not isinstance(param, DTensor) or param.grad is None:
        raise DistributedError(f"sharding: parameter {name!r} is not a sharded trainable parameter of this state")
    return param


def _local_moments(
    name: str, param: DTensor, local: Tensor, moments: dict[str, Tensor] | None, keys: Sequence[str]
) -> dict[str, Tensor]:
    """This rank's shard of a parameter's moments: kept, or cut from a checkpoint's whole ones as FSDP2
    cuts the parameter (dim-0 chunks)."""
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
        owned[key] = local_chunk(moment.to(local.device), param)
    return owned


def local_chunk(whole: Tensor, param: DTensor) -> Tensor:
    """This rank's piece of ``whole`` (a tensor of ``param``'s shape), cut as FSDP2 cut ``param``: a copy."""
    mesh = param.device_mesh
    chunks = torch.chunk(whole.detach(), mesh.size(), dim=0)
    rank = mesh.get_local_rank()
    piece = chunks[rank] if rank < len(chunks) else whole.new_zeros((0, *whole.shape[1:]))
    return piece.clone().view(param.to_local().shape)


def local_shard(tensor: Tensor) -> Tensor:
    """A sharded tensor's local shard (the same storage), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def global_norm(grads: Sequence[Tensor], group: Any) -> Tensor:
    """The L2 norm of every rank's gradient shards together (one all-reduce over ``group``)."""
    squared = torch.stack(torch._foreach_norm(list(grads))).square().sum()
    dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=group)
    return squared.sqrt()


def _require_same_settings(settings: list[Any], group: Any, device: torch.device) -> None:
    """Raise on every rank when the ranks' sharding settings differ (a collective)."""
    digest = hashlib.blake2b(repr(settings).encode(), digest_size=32).digest()
    require_identical(
        {"sharding": torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)},
        group,
        "sharding settings",
        "every rank must be launched with the same sharding and model",
    )
