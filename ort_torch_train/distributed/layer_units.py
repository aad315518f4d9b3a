"""The converted training graph cut into per-layer units, so that FSDP2 shards and gathers one layer at a time.

A converted graph is one flat ``fx.GraphModule`` that takes the parameters as inputs. ``layer_of`` names
a parameter's layer by its name: in a numbered layer, the block of it the parameter sits in (the prefix up
to the component after the first number: ``model.layers.3.self_attn``, ``transformer.h.0.mlp``,
``transformer.h.0.ln_1``), else the prefix up to the number (``h.0``), else the name without its last
component (``fc1``); a transformer layer is so cut into its attention, MLP and norms, and no more than
one such block's parameters are gathered at a time. With ``whole_layers`` (``UnitRecompute``: whole
transformer layers recomputed) a numbered layer is one unit (``model.layers.3``): its parameters are
gathered together, as its recomputed region reads them all. ``LayerPlan`` gives each layer
whose parameters the ONNX graph reads in one stretch a unit of its own; the parameters read across layers
(tied embeddings) or outside any layer are shared: they form one more unit, called for each stretch of
the graph that reads them (a tied embedding: the lookup first, the output projection last), unless a
node reads them together with a layer's parameters, when the root holds them. ``LayeredGraph`` cuts a
converted module (``torch.fx.passes.split_module``) into one partition per such stretch, in graph order,
and runs each partition inside its unit's ``forward``, so the unit's FSDP hooks gather its parameters
around it (and, for ZeRO-3, free them after it) and reduce-scatter their gradients when its backward is
done: a shared unit's after each of its stretches' backward. With ``UnitRecompute.each_unit`` every
partition runs under ``torch.utils.checkpoint`` (``checkpointed``): its backward gathers the parameters
again, reruns the partition (the same random numbers) and keeps none of its activations in between.
Given a ``compiler`` (compiled sharded steps), each partition runs compiled, the checkpoint inside the
compiled function (torch.compile traces it and recomputes the partition in the compiled backward): one
stretch's forward and backward inside the unit's FSDP hooks, which stay eager.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import torch
from torch import Tensor, fx, nn
from torch.fx.passes.split_module import split_module
from torch.utils.checkpoint import checkpoint

from ort_torch_train.errors import DistributedError

_NUMBERED_BLOCK = re.compile(r"^(.*?\.\d+\.[^.]+)\.")
_NUMBERED = re.compile(r"^(.*?\.\d+)\.")


def layer_of(name: str, whole_layers: bool = False) -> str:
    """The layer a parameter belongs to, by its name: a numbered layer's block, or with ``whole_layers`` the
    numbered layer (see the module doc)."""
    match = (None if whole_layers else _NUMBERED_BLOCK.match(name)) or _NUMBERED.match(name)
    if match:
        return match.group(1)
    head, dot, _ = name.rpartition(".")
    return head if dot else name


@dataclass(frozen=True)
class UnitRecompute:
    """What a sharded run recomputes, checked once: ``each_unit``, every unit's partitions under checkpoint;
    ``whole_layers``, regions of the graph spanning whole numbered layers (a legacy session's
    ``transformer_layer_recompute``), so each numbered layer is one unit."""

    each_unit: bool = False
    whole_layers: bool = False

    @classmethod
    def of(cls, recompute: object) -> UnitRecompute:
        """From an engine's recompute setting: True each unit; a plan with ``transformer_layers`` set (a
        ``RecomputePlan``) whole layers; anything else (None, regions inside one block) neither."""
        return cls(each_unit=recompute is True, whole_layers=getattr(recompute, "transformer_layers", None) is not None)


@dataclass(frozen=True)
class LayerPlan:
    """Which unit owns each parameter: ``owner[i]`` is the unit index of the i-th graph parameter, or None
    (shared); ``units[k]`` the layer name of unit k, in the order the graph reads them; ``shared_unit``:
    whether the shared parameters form a unit of their own (no node reads them with a layer's)."""

    units: tuple[str, ...]
    owner: tuple[int | None, ...]
    shared_unit: bool = False

    @property
    def unit_count(self) -> int:
        """The layer units, and the shared unit when there is one."""
        return len(self.units) + (self.shared_unit and None in self.owner)

    def unit_of(self, index: int) -> int | None:
        """The unit of the ``index``-th parameter (the shared unit's index is ``len(units)``), None: the root's."""
        owner = self.owner[index]
        return owner if owner is not None else (len(self.units) if self.shared_unit else None)

    @classmethod
    def of(cls, graph: onnx.GraphProto, param_names: Sequence[str], whole_layers: bool = False) -> LayerPlan:
        """The plan for a forward graph reading ``param_names``: a layer's parameters go to its unit when
        every node reading them sits between the layer's first node and the next layer's first node.
        ``whole_layers``: a numbered layer is one layer, not one per block (``layer_of``)."""
        layers = {name: layer_of(name, whole_layers) for name in param_names}
        readers: dict[str, list[int]] = {name: [] for name in param_names}
        order: list[str] = []  # layers, by their first reader
        for index, node in enumerate(graph.node):
            for name in node.input:
                if name in readers:
                    readers[name].append(index)
                    if layers[name] not in order:
                        order.append(layers[name])
        first = {layer: min(readers[n][0] for n in param_names if layers[n] == layer and readers[n]) for layer in order}
        bounds = sorted(first.values()) + [len(graph.node)]
        stretch = {layer: (start, bounds[bounds.index(start) + 1]) for layer, start in first.items()}
        owned: dict[str, str | None] = {}
        for name in param_names:
            layer = layers[name]
            inside = layer in stretch and all(stretch[layer][0] <= i < stretch[layer][1] for i in readers[name])
            owned[name] = layer if inside and readers[name] else None
        units = tuple(layer for layer in order if layer in owned.values())
        unit_index = {layer: k for k, layer in enumerate(units)}
        shared = {name for name in param_names if owned[name] is None}
        mixed = any(
            shared.intersection(node.input) and any(owned.get(name) is not None for name in node.input)
            for node in graph.node
        )
        owner = tuple(None if (own := owned[n]) is None else unit_index[own] for n in param_names)
        return cls(units, owner, shared_unit=not mixed)


class Unit(nn.Module):
    """One layer's parameters (``fully_shard`` shards and gathers them); its ``forward`` runs a partition
    of the graph with them put in at ``positions`` of its arguments."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        super().__init__()
        self.params = nn.ParameterList(params)

    def forward(self, partition: Callable, positions: tuple[tuple[int, int], ...], *args: object) -> object:
        """``partition(*args)`` with parameter ``k`` of this unit put in at argument ``position`` for each
        ``(position, k)`` of ``positions``."""
        values = list(args)
        for position, k in positions:
            values[position] = self.params[k]
        outputs = partition(*values)
        if isinstance(outputs, tuple):
            return tuple(_not_a_view(output) for output in outputs)
        return _not_a_view(outputs)


def _not_a_view(value: object) -> object:
    """A view tensor copied (FSDP2's pre-backward hook on a unit's output would be lost to an in-place op on
    a view of it), anything else as it is."""
    return value.clone() if isinstance(value, Tensor) and value._is_view() else value


def checkpointed(partition: fx.GraphModule) -> fx.GraphModule:
    """A module that runs ``partition`` under ``torch.utils.checkpoint`` while gradients are on: a graph of
    its own (torch.compile traces the checkpoint in it, and caches it apart from every other partition's)."""
    graph = fx.Graph()
    inputs = [graph.placeholder(node.name) for node in partition.graph.nodes if node.op == "placeholder"]
    graph.output(graph.call_function(recomputed, (graph.get_attr("segment"), *inputs)))
    holder = nn.Module()
    holder.segment = partition
    return fx.GraphModule(holder, graph, class_name="CheckpointedPartition")


def recomputed(segment: Callable, *args: object) -> object:
    """``segment(*args)``, under checkpoint (its activations recomputed in backward) while gradients are on."""
    if not torch.is_grad_enabled():
        return segment(*args)
    return checkpoint(segment, *args, use_reentrant=False)


class _UnitCall(nn.Module):
    """A partition of the cut graph (checkpointed with ``recompute``, then compiled by ``compiler`` when
    given), run inside its unit's forward."""

    def __init__(
        self,
        unit: Unit,
        partition: fx.GraphModule,
        positions: tuple[tuple[int, int], ...],
        compiler: Callable[[fx.GraphModule], Callable] | None,
        recompute: bool,
    ) -> None:
        super().__init__()
        self.partition = checkpointed(partition) if recompute else partition
        run = self.partition if compiler is None else compiler(self.partition)
        self._run = [run]  # a list: kept out of the module tree
        self._unit = [unit]  # a list: the unit stays out of this module's tree
        self.positions = positions

    def forward(self, *args: object) -> object:
        return self._unit[0](self._run[0], self.positions, *args)


class LayeredGraph:
    """A converted module cut into one partition per stretch of a unit (see the module doc): called with the
    user inputs, then the parameters (None where a unit puts in its own). ``recompute``: each partition
    checkpointed (``checkpointed``)."""

    def __init__(
        self,
        module: fx.GraphModule,
        plan: LayerPlan,
        units: Sequence[Unit],
        user_inputs: int,
        compiler: Callable[[fx.GraphModule], Callable] | None = None,
        recompute: bool = False,
    ) -> None:
        placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
        param_nodes = placeholders[user_inputs:]
        unit_of = {node: k for i, node in enumerate(param_nodes) if (k := plan.unit_of(i)) is not None}
        param_of = {node.name: i for i, node in enumerate(param_nodes)}
        names = [*plan.units, "shared parameters"]
        segments: list[int] = []  # the unit of each partition, in graph order
        partition_of: dict[fx.Node, int] = {}
        running = 0  # the last layer begun
        for node in module.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            owners = {(arg, k) for arg in node.all_input_nodes if (k := unit_of.get(arg)) is not None}
            for arg, k in owners:
                if k < len(plan.units) and k < running:
                    raise DistributedError(
                        f"sharding: the converted graph reads layer {names[k]!r}'s parameter {arg.target!r} after "
                        f"layer {names[running]!r} began; its layers are not in order, so it cannot be cut into "
                        "per-layer units"
                    )
                running = max(running, k if k < len(plan.units) else running)
            if len({k for _, k in owners}) > 1:
                raise DistributedError(
                    f"sharding: node {node.name!r} of the converted graph reads the parameters of "
                    f"{sorted(names[k] for _, k in owners)} together; it cannot be cut into per-layer units"
                )
            if owners and (not segments or segments[-1] != next(iter(owners))[1]):
                segments.append(next(iter(owners))[1])
            partition_of[node] = max(len(segments) - 1, 0)
        self.split = split_module(module, module, lambda node: partition_of[node], keep_original_order=True)
        unit_params = [[i for i in range(len(plan.owner)) if plan.unit_of(i) == k] for k in range(len(units))]
        for node in self.split.graph.nodes:
            if node.op != "call_module" or not units:
                continue
            index = segments[int(str(node.target).rsplit("_", 1)[1])] if segments else 0
            positions = []
            for position, arg in enumerate(node.args):
                param = param_of.get(arg.name) if isinstance(arg, fx.Node) and arg.op == "placeholder" else None
                if param is not None and plan.unit_of(param) == index:
                    positions.append((position, unit_params[index].index(param)))
            if index < len(plan.units) and len(positions) != len(unit_params[index]):
                raise DistributedError(
                    f"sharding: layer {names[index]!r}'s partition of the converted graph reads "
                    f"{len(positions)} of its {len(unit_params[index])} parameters"
                )
            partition = getattr(self.split, str(node.target))
            setattr(
                self.split, str(node.target), _UnitCall(units[index], partition, tuple(positions), compiler, recompute)
            )

    def __call__(self, *args: Tensor | None) -> tuple[Tensor, ...]:
        return tuple(self.split(*args))


class ZeroStandIns(Sequence[Tensor]):
    """Zero tensors of the parameters' whole shapes, made when read: what a conversion's example run
    takes where the parameters are sharded (the examples' values drive only shape-finding runs)."""

    def __init__(self, params: Sequence[Tensor]) -> None:
        self._specs = [(tuple(p.shape), p.dtype, p.device) for p in params]

    def __len__(self) -> int:
        return len(self._specs)

    def __getitem__(self, index: Any) -> Any:  # Sequence's int and slice forms
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        shape, dtype, device = self._specs[index]
        return torch.zeros(shape, dtype=dtype, device=device)
