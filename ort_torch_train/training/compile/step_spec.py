"""What makes one compiled train step: ``StepSpec``, and the ``ParameterPlan`` among its fields.

The spec is at once the step's key among its graph's specialisations (frozen, hashable), the argument
``CompiledTrainStep`` is built from and, through ``key_parts``, the parts of its precompiled key
(``precompiled.step_key``): a field added to it counts in all three.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from ort_torch_train.optim.compiled import FusedUpdate
from ort_torch_train.state.flat import FlatLayout
from ort_torch_train.training.compile.settings import FrozenArguments, for_device
from ort_torch_train.training.precision import MixedPrecision

Reduction = Callable[[list[Tensor]], list[Tensor]]  # gradients -> their average across ranks
# a field holding one of this process's objects: a saved step refers to it by name, never pickles it
_EXTERNAL = {"external": True}


@dataclass(frozen=True)
class ParameterPlan:
    """Where each graph parameter comes from: ``(True, i)`` the i-th trainable, ``(False, i)`` the i-th frozen."""

    sources: tuple[tuple[bool, int], ...]

    @classmethod
    def of(cls, graph_names: Sequence[str], trainable_names: Sequence[str]) -> ParameterPlan:
        """The plan for a graph taking ``graph_names``; the frozen ones keep the graph's order."""
        trainable_index = {name: i for i, name in enumerate(trainable_names)}
        frozen = [name for name in graph_names if name not in trainable_index]
        frozen_index = {name: i for i, name in enumerate(frozen)}
        return cls(
            tuple((True, trainable_index[n]) if n in trainable_index else (False, frozen_index[n]) for n in graph_names)
        )

    def frozen_names(self, graph_names: Sequence[str]) -> list[str]:
        """The graph's frozen parameter names, in the order the step takes them."""
        return [name for name, (trainable, _) in zip(graph_names, self.sources) if not trainable]


def _precision_setting(precision: MixedPrecision | None) -> str | None:
    return None if precision is None else precision.setting


@dataclass(frozen=True)
class StepSpec:
    """One compiled train step: the graph's parameter ``plan``, torch.compile's ``compile_arguments``, the
    optimizer ``update`` run in the step's graph, the data-parallel gradient ``reduction``, the mixed
    ``precision``, the flat buffers' ``layout`` (``state/flat.py``) and whether the step returns
    ``fresh_gradients`` of its own (``state/fresh_gradients.py``; needs an update)."""

    plan: ParameterPlan
    compile_arguments: FrozenArguments = FrozenArguments()
    update: FusedUpdate | None = field(default=None, metadata=_EXTERNAL)
    reduction: Reduction | None = field(default=None, metadata=_EXTERNAL)
    precision: MixedPrecision | None = field(default=None, metadata={**_EXTERNAL, "key": _precision_setting})
    layout: FlatLayout | None = None
    fresh_gradients: bool = False

    def __post_init__(self) -> None:
        if self.fresh_gradients and self.update is None:
            raise ValueError("fresh_gradients: a step that makes gradients of its own needs an update")

    def on_device(self, device: torch.device) -> StepSpec:
        """This spec with this project's inductor defaults for ``device`` among its compile arguments
        (``settings.for_device``; no C++ wrapper for a step with a collective reduction)."""
        arguments = for_device(self.compile_arguments, device, cpp_wrapper=self.reduction is None)
        return replace(self, compile_arguments=FrozenArguments(arguments))

    def key_parts(self) -> tuple[tuple[str, object], ...]:
        """Every field by name, for the step's precompiled key; mixed precision by its setting."""
        return tuple((f.name, f.metadata.get("key", _itself)(getattr(self, f.name))) for f in fields(self))

    def external(self) -> dict[str, object]:
        """The fields that are this process's own objects: a saved step names them, never pickles them."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("external")}

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:  # once: a spec is hashed at every compiled step, as its graph's cache key
        return hash(tuple(getattr(self, f.name) for f in fields(self)))


def _itself(value: object) -> object:
    return value
