"""The record of one ORT optimizer op type: everything that differs from one optimizer algorithm to another.

Modelled on torch/optim, where an optimizer is a thin class over one functional kernel: here each
algorithm is one functional kernel and one ``OptimizerAlgorithm`` record. The optimizer-model reader, the
engine, ZeRO, ``inspect`` and the artifact generator look the record up (``optim/registry.py``) and never
branch on an algorithm's name, so a new algorithm is one module: its kernel and its record, registered.
The built-in records sit in torch-free modules beside their kernels (``optim/adamw_record.py`` naming
``optim/adamw.py``'s through ``lazy_kernel``), so that reading an optimizer model needs no torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ort_torch_train.optim.float32 import to_float32

if TYPE_CHECKING:  # the records need no torch: their kernels import it when they run (``lazy_kernel``)
    from torch import Tensor

    from ort_torch_train.optim.compiled import FusedUpdate

MS_DOMAIN = "com.microsoft"
DEFAULT_LEARNING_RATE = to_float32(0.001)  # ORT's, until the first set_learning_rate (a float32 value)
AttributeValue = float | int | str  # an optimizer node's attribute, as ONNX's helper reads it


class Hyperparameters(Protocol):
    """A kernel's hyperparameters: the learning rate and what the optimizer node's attributes set."""

    @property
    def lr(self) -> float:
        """The learning rate (a float32 value)."""
        ...

    def with_learning_rate(self, lr: float) -> Hyperparameters:
        """These hyperparameters with another learning rate."""
        ...


class HostStepScalars(Protocol):
    """The fused update's per-step scalars (``OptimizerAlgorithm.step_scalars``) in one host float32 tensor,
    rewritten in place at each step: a compiled step or program reads it before it returns."""

    def write(self, hyperparameters: Hyperparameters, step: int) -> Tensor:
        """The tensor, holding the scalars of the 1-based ``step`` for ``hyperparameters``."""
        ...


class PreparedKernel(NamedTuple):
    """What every kernel call on the same tensor lists reuses: the implementation chosen and its buffers."""

    implementation: str  # one of the record's ``implementations``
    scratch: tuple[list[Tensor], ...] | None  # ``scratch_lists`` reused buffers shaped like the params, or None
    step_tensor: Tensor | None  # a reused float32 scalar on the params' device, for kernels that read the step so


TensorLists = list["Tensor"]
# kernel(params, grads, moments (one list per name of ``updated_moments``), hyperparameters, the 1-based step
# fed to the node (completed steps + 1), the prepared kernel)
Update = Callable[[TensorLists, TensorLists, list[TensorLists], Hyperparameters, int, PreparedKernel], None]


@dataclass(frozen=True, eq=False, repr=False)
class OptimizerAlgorithm:
    """One ORT optimizer op type: its optimizer-graph layout, hyperparameters, state and kernels.

    Records compare by identity; ``repr`` names the op type only (ranks compare specs by their repr).
    """

    op_type: str  # the optimizer node's op type, e.g. "AdamWOptimizer"
    display_name: str  # as ``inspect`` prints it, e.g. "AdamW"
    name: str  # the kernel's name, as error messages name the algorithm, e.g. "adamw"
    graph_inputs: tuple[str, ...]  # the optimizer graph's inputs, before the optional update signal
    node_inputs: tuple[str, ...]  # the node's input slots, before the optional update signal
    attribute_defaults: Mapping[str, AttributeValue]  # every attribute the node may have; the type fixes ONNX's
    # the kernel's hyperparameters (at DEFAULT_LEARNING_RATE) from every attribute; ModelError for values ORT refuses
    make_hyperparameters: Callable[[Mapping[str, AttributeValue]], Hyperparameters]
    reported: Callable[[Hyperparameters], dict[str, float | int | bool]]  # what ``inspect`` reports of them
    # Per-parameter moments: ``stored_moments`` are what ORT's checkpoint holds (created as zeros);
    # ``updated_moments`` (a subset, in that order) are the ones the kernel reads and writes.
    stored_moments: tuple[str, ...]
    updated_moments: tuple[str, ...]
    implementations: tuple[str, ...]  # the kernel implementations one may ask for
    # the implementation chosen when none is asked for, from the tensor lists (params, grads, moments)
    default_implementation: Callable[[TensorLists, TensorLists, list[TensorLists]], str]
    update: Update  # one in-place step of the kernel
    scratch_lists: int  # reused buffer lists the "foreach" implementation takes on CPU
    # the update as a compiled train step runs it, for these hyperparameters and the clip's max norm
    fused_update: Callable[[Hyperparameters, float | None], FusedUpdate]
    # the fused update's per-step scalars for a 1-based step: one value, or several in the kernel's order
    step_scalars: Callable[[Hyperparameters, int], float | Sequence[float]]
    # ZeRO's and the flat buffers' layout need: an update whose every element reads only the same element
    # of each tensor may run on any contiguous slice of the flattened tensors, or on one flat buffer
    elementwise: bool
    domain: str = MS_DOMAIN
    # a maker of the writer of ``step_scalars`` into a host tensor that recomputes only what a step changes; None:
    # the engine writes ``step_scalars``' values (``host_scalars.RecomputedStepScalars``)
    host_step_scalars: Callable[[], HostStepScalars] | None = None

    def hyperparameters(self, attributes: Mapping[str, AttributeValue] | None = None) -> Hyperparameters:
        """The kernel's hyperparameters for these node attributes over the defaults (at DEFAULT_LEARNING_RATE)."""
        return self.make_hyperparameters({**self.attribute_defaults, **(attributes or {})})

    def __repr__(self) -> str:
        return f"OptimizerAlgorithm({self.domain}::{self.op_type})"


@dataclass(frozen=True)
class LazyKernel:
    """``module.function``, the module imported at the first call: a record names its kernels this way, so that
    reading an optimizer model needs no torch (and the record still pickles by reference)."""

    module: str
    function: str

    def __call__(self, *args: Any) -> Any:
        module = sys.modules.get(self.module)  # imported already: no import machinery at every step
        if module is None:
            module = importlib.import_module(self.module)
        return getattr(module, self.function)(*args)


def lazy_kernel(module: str, function: str) -> Callable[..., Any]:
    """The kernel ``module.function``, imported when it first runs."""
    return LazyKernel(module, function)
