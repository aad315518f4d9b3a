"""Sharded training on FSDP2 (``torch.distributed.fsdp.fully_shard``): ZeRO-2 and ZeRO-3.

``Module(..., sharding="zero2"|"zero3")``. The training graph is cut into per-layer units and a unit of
the parameters layers share (``layer_units.py``); each unit, then the root (holding shared parameters
that no unit can), goes through ``fully_shard`` over the data-parallel group. Every rank then keeps dim-0 shards of the parameters
(DTensors, which replace the state's parameters), of their gradients (reduce-scattered, averaged) and
of the optimizer's moments. A unit's parameters are gathered before its part of the forward; "zero3"
frees them after it and gathers them again for its backward (``reshard_after_forward=True``), "zero2"
keeps them until its backward is done. The optimizer kernels run on the local shards
(``local_shards.LocalShards``); the gradient clip uses the norm of every rank's shards together. A checkpoint save
is a collective: every rank gathers the whole parameters and moments and rank 0 writes the same ODTC
bytes one process writes (``local_shards.ShardedCheckpoint``). Reading a parameter through the state gathers it
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

from ort_torch_train.distributed.data_parallel import DataParallel, require_identical
from ort_torch_train.distributed.layer_units import LayeredGraph, LayerPlan, Unit, UnitRecompute, ZeroStandIns
from ort_torch_train.distributed.local_shards import ShardedCheckpoint, sharded_optimizer_engine
from ort_torch_train.errors import DistributedError
from ort_torch_train.optim.engine import OptimizerEngine
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
        return sharded_optimizer_engine(engine, self.checkpoint, self.group, **arguments)


def _require_same_settings(settings: list[Any], group: Any, device: torch.device) -> None:
    """Raise on every rank when the ranks' sharding settings differ (a collective)."""
    digest = hashlib.blake2b(repr(settings).encode(), digest_size=32).digest()
    require_identical(
        {"sharding": torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)},
        group,
        "sharding settings",
        "every rank must be launched with the same sharding and model",
    )
