"""A train step as one torch.compile'd graph: forward, backward and, optionally, the optimizer update.

``torch.func.grad`` traces the converted module's backward into the graph of its forward, so a step
runs neither the autograd engine nor per-op Python. The gradients go straight into the parameters'
``.grad`` tensors (added to them, or copied over them after a reset) and an update given as a
``FusedUpdate`` runs in the same graph on those gradients. Whether the gradients are added to or
overwritten is a boolean tensor, not a Python flag: one graph serves both, so a model compiles once.
A step with an update may instead return gradients of its own (``fresh_gradients``), for steps that
overwrite them: the caller frees the old ones first (``state/fresh_gradients.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx

from ort_torch_train.convert.meta_keys import MATRIX_PRODUCTS
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.progress import Phase
from ort_torch_train.torch_internals import (
    GradDisabled,
    dynamic_tracing_errors,
    mark_static_address,
    size_one_kept_dynamic,
)
from ort_torch_train.training.blas_threads import blas_threads_for
from ort_torch_train.training.compile import fallbacks, precompiled
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.settings import records_cuda_graphs, torch_compile
from ort_torch_train.training.compile.step_spec import StepSpec
from ort_torch_train.training.dynamic_shapes import DynamicAxes, marked_args
from ort_torch_train.training.meta_keys import DYNAMIC_AXES, DYNAMIC_GROUPS
from ort_torch_train.training.precision import autocast_or_null
from ort_torch_train.training.threads import ThreadPolicy

log = logging.getLogger(__name__)


class CompiledTrainStep:
    """``step(inputs, trainable, frozen, grads, reset, states, scalars) -> outputs`` for one converted module
    and the ``StepSpec`` saying what the step does (``step_spec.py``).

    ``trainable``/``frozen`` are detached aliases of the parameters (updated in place), ``grads``
    the trainable ones' ``.grad``; with the spec's ``layout``, ``trainable``, ``grads`` and each list of
    ``states`` hold one flat buffer laid out so (``state/flat.py``). ``reset`` overwrites the gradients
    instead of adding to them (the compiled graph reads it as a tensor: one compilation for both).
    ``states`` (lists of optimizer moments) and ``scalars`` feed the spec's ``update`` when there is one.
    Its ``reduction`` (data parallel) replaces the accumulated gradients by their average across ranks.
    With ``fresh_gradients`` the step neither reads nor writes ``grads`` and ``reset``: it returns
    ``(outputs, gradients)``, its own gradients for ``fresh_gradients.py`` to install. The step is loaded
    from and saved to the compile ``cache`` (None: compiled in this process only); its CPU runs follow the
    ``threads`` policy.
    """

    def __init__(
        self, module: fx.GraphModule, spec: StepSpec, *, cache: CompileCache | None = None, threads: ThreadPolicy
    ) -> None:
        self.spec = spec
        step = _train_step_function(module, spec)
        self._products: list[int] | None = MATRIX_PRODUCTS.get(module, None)  # they decide its BLAS threads
        # the (input position, axis) pairs compiled as dynamic dimensions, less those torch specialised
        self.dynamic_axes: tuple[tuple[int, int], ...] = DYNAMIC_AXES.get(module, ())
        self._groups = DYNAMIC_GROUPS.get(module, DynamicAxes())  # how those axes take their sizes
        self._scaler = None if spec.precision is None else spec.precision.loss_scaler
        compile_arguments = spec.compile_arguments.thawed()
        self._cuda_graphs = records_cuda_graphs(compile_arguments)
        external = {"module": module, **spec.external()}
        # precompiled at the first call (precompiled.py), unless it records CUDA graphs on CUDA
        self._compilation = Compilation(step, module, external, compile_arguments, "train step", cache)
        self._compiled, self._precompile = self._compilation.start(self.dynamic_axes)
        self._threads = threads
        self._compiled_at_threads = 0  # torch's thread count at the first call, which compiled the step
        self._called = False
        self._reset_flags: dict[torch.device, tuple[Tensor, Tensor]] = {}
        self._steady: tuple[torch.device, tuple[Tensor, Tensor]] | None = None  # once called on CPU: its flags

    def __call__(
        self,
        inputs: Sequence[Tensor],
        trainable: list[Tensor],
        frozen: list[Tensor],
        grads: list[Tensor],
        reset: bool,
        states: Sequence[list[Tensor]] = (),
        scalars: Tensor | None = None,
    ) -> tuple:
        inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]
        first = trainable[0]
        steady = self._steady
        if steady is not None and first.is_cpu and self._scaler is None:  # the steady state on CPU
            self._threads.hold(self._compiled_at_threads, steady[0])
            with GradDisabled(), blas_threads_for(self._products, steady[0]):
                return self._compiled(inputs, trainable, frozen, grads, steady[1][reset], tuple(states), scalars, None)
        device = first.device
        arguments = (
            inputs,
            trainable,
            frozen,
            grads,
            self._reset_flag(reset, device),
            tuple(states),
            scalars,
            None if self._scaler is None else self._scaler.scale.to(device),
        )
        if self._called and not (self._cuda_graphs and device.type == "cuda"):  # the steady state elsewhere
            self._threads.hold(self._compiled_at_threads, device)
            with GradDisabled(), blas_threads_for(self._products, device):
                return self._compiled(*arguments)
        outputs = self._first_or_recorded_call(arguments, device)
        if self._called and device.type == "cpu":
            self._steady = (device, self._reset_flags[device])
        return outputs

    def _first_or_recorded_call(self, arguments: tuple, device: torch.device) -> tuple:
        """The first call (compiling the step), or a call of a step recorded as CUDA graphs."""
        first = not self._called
        compiling = (
            Phase(
                log,
                "compiling the train step",
                done=f"compiled the train step for inputs {[tuple(t.shape) for t in arguments[0]]}",
            )
            if first
            else nullcontext()
        )
        cuda_graphs = self._cuda_graphs and device.type == "cuda"
        if cuda_graphs:  # updated in place: CUDA graphs replay only on inputs at fixed addresses
            trainable, frozen, grads, states = arguments[1], arguments[2], arguments[3], arguments[5]
            for tensor in (*trainable, *frozen, *grads, *(t for moments in states for t in moments)):
                mark_static_address(tensor)
        if self._called:
            self._threads.hold(self._compiled_at_threads, device)
        else:
            self._threads.follow_load(device)
            self._compiled_at_threads = torch.get_num_threads()
        with compiling, GradDisabled(), blas_threads_for(self._products, device):
            if self._precompile is None:
                outputs = self._compiled(*arguments)
            else:  # traced so that batch 1 takes the graph of the other sizes
                with size_one_kept_dynamic(bool(self.dynamic_axes)):
                    outputs = self._first_call(arguments, cuda_graphs)
        if cuda_graphs:  # the outputs live in the graph's memory, which the next replay overwrites
            outputs = tuple(t.clone() for t in outputs)
        if first:
            self._called = True
            self._threads.restart_load_window()
        return outputs

    def _first_call(self, arguments: tuple, cuda_graphs: bool) -> tuple[Tensor, ...]:
        """Compile (its dynamic axes marked) and run; where torch specialises some of those axes, compiled
        again with them fixed, and uncompiled where torch cannot compile the step at all. Both are
        remembered (``fallbacks.py``) for every conversion of this graph: a new input size tries neither again."""
        module, parts, cache = self._compilation.module, self.spec.key_parts(), self._compilation.cache
        structure = fallbacks.structure_key(module, parts)
        if self.dynamic_axes:
            specialised = fallbacks.recalled_axes(structure, cache)
            if specialised is not None:
                self._fix_axes(specialised, arguments[0], remembered=True)
        reason = fallbacks.recalled(fallbacks.EAGER, structure, cache)
        if reason is not None:
            return self._run_eagerly(arguments, reason, remembered=True)
        try:
            return self._compiled_first_call(arguments, cuda_graphs)
        except dynamic_tracing_errors() as error:
            reason = specialisation(error)
            fallbacks.remember(fallbacks.EAGER, structure, reason, cache)
            return self._run_eagerly(arguments, reason, remembered=False)

    def _compiled_first_call(self, arguments: tuple, cuda_graphs: bool) -> tuple[Tensor, ...]:
        while True:  # each failure fixes one axis or more: at most one try per dynamic group, then fixed shapes
            try:
                self._precompiled(arguments, cuda_graphs)
                if isinstance(self._compiled, precompiled.GuardedStep):
                    return self._compiled(*arguments)
                return self._compiled(*marked_args(arguments, self.dynamic_axes))
            except dynamic_tracing_errors() as error:
                if not self.dynamic_axes:
                    raise
                key = fallbacks.structure_key(self._compilation.module, self.spec.key_parts())
                named = fallbacks.specialised_axes(error, self.dynamic_axes)
                found = fallbacks.Specialised(named, specialisation(error))
                self._fix_axes(fallbacks.remember_axes(key, found, self._compilation.cache), arguments[0], False)

    def _fix_axes(self, specialised: fallbacks.Specialised, inputs: Sequence[Tensor], remembered: bool) -> None:
        """Compile with the axes torch ``specialised`` fixed from now on, and the graph's other dynamic axes
        still dynamic (all fixed where a group's axis is: ``DynamicAxes.without``)."""
        fixed = specialised.fixed(self.dynamic_axes)
        if not fixed:
            return
        kept = self._groups.without(fixed, [tuple(t.shape) for t in inputs])
        self._compiled, self._precompile = self._compilation.fixed(
            self.dynamic_axes, kept.axes, specialised.reason, remembered
        )
        self._groups, self.dynamic_axes = kept, kept.axes

    def _run_eagerly(self, arguments: tuple, reason: str, remembered: bool) -> tuple[Tensor, ...]:
        """Run the step uncompiled from now on, torch.compile having failed on it (``reason``)."""
        self._compiled, self._precompile = self._compilation.eager(arguments[0], reason, remembered)
        return self._compiled(*arguments)

    def _precompiled(self, arguments: tuple, cuda_graphs: bool) -> None:
        """Replace the compiled step by a precompiled (or saved) one, where torch can precompile it
        (CUDA graphs are recorded and replayed by torch.compile's own call)."""
        precompile, self._precompile = self._precompile, None
        if precompile is not None and not cuda_graphs:
            self._compiled = precompile.replacing(self._compiled, self.spec.key_parts(), arguments)

    def _reset_flag(self, reset: bool, device: torch.device) -> Tensor:
        """A 0-d boolean tensor on ``device`` (one per value, made once)."""
        flags = self._reset_flags.get(device)
        if flags is None:
            flags = self._reset_flags[device] = (torch.tensor(False, device=device), torch.tensor(True, device=device))
        return flags[reset]


@dataclass(frozen=True)
class Compilation:
    """What a compiled step (or forward) is compiled from: ``start`` gives its torch.compile'd callable and
    the precompile to run at its first call."""

    function: Callable
    module: torch.nn.Module
    external: Mapping[str, object]
    compile_arguments: Mapping[str, Any]
    what: str
    cache: CompileCache | None = None  # where its precompiled form is loaded from and saved to

    def start(self, dynamic_axes: tuple[tuple[int, int], ...]) -> tuple[Callable, precompiled.Precompile | None]:
        """A fresh compilation whose first call marks ``dynamic_axes``."""
        return torch_compile(self.function, self.compile_arguments), precompiled.Precompile(
            self.function, self.module, self.external, self.compile_arguments, self.what, dynamic_axes, self.cache
        )

    def fixed(
        self,
        dynamic_axes: tuple[tuple[int, int], ...],
        kept: tuple[tuple[int, int], ...],
        reason: str,
        remembered: bool = False,
    ) -> tuple[Callable, precompiled.Precompile | None]:
        """A fresh compilation with only the ``kept`` axes of ``dynamic_axes`` dynamic (none: fixed shapes),
        after torch could not keep the others dynamic (``reason``: torch's error, in this compilation or,
        ``remembered``, an earlier one)."""
        log.info(
            "dynamic shapes: torch.compile cannot keep the %s's axes %s dynamic (%s%s); compiling it %s",
            self.what,
            [axis for axis in dynamic_axes if axis not in kept],
            reason,
            ", remembered from an earlier compilation" if remembered else "",
            f"with the axes {list(kept)} dynamic"
            if kept
            else "for fixed shapes: each new size compiles a step of its own",
        )
        return self.start(kept)

    def eager(self, inputs: Sequence[Tensor], reason: str, remembered: bool = False) -> tuple[Callable, None]:
        """The uncompiled function, after torch.compile failed on it for ``inputs`` (``reason``: torch's
        error, in this compilation, with a WARNING, or, ``remembered``, an earlier one, said at INFO)."""
        log.log(
            logging.INFO if remembered else logging.WARNING,
            "torch.compile cannot compile the %s for inputs %s (%s%s); it runs uncompiled (eager) from now on",
            self.what,
            [tuple(t.shape) for t in inputs],
            reason,
            ", remembered from an earlier compilation" if remembered else "",
        )
        return self.function, None


def specialisation(error: Exception) -> str:
    """The line of torch's error naming what it specialised or could not trace (its first, else, with the
    next where the first only introduces it)."""
    lines = [line.strip(" -") for line in str(error).splitlines() if line.strip()]
    found = next((line for line in lines if "specialized" in line or "got " in line), None)
    if found is None:
        found = " ".join(lines[:2]) if lines and lines[0].endswith(":") else lines[0] if lines else ""
    return found[:300] or repr(error)


def _train_step_function(module: Callable, spec: StepSpec) -> Callable:
    # the step's closure holds each value, not the spec: the precompiled step's guards are kept or left
    # out per value (precompiled._guard_filter)
    sources, update, reduction, precision = spec.plan.sources, spec.update, spec.reduction, spec.precision
    layout, fresh_gradients = spec.layout, spec.fresh_gradients

    def train_step(inputs, trainable, frozen, grads, reset, states, scalars, loss_scale):
        def loss_and_outputs(trainable, frozen):  # frozen is an input too: BatchNorm updates its statistics
            if layout is not None:  # one flat buffer: the trainable parameters are views of it
                trainable = layout.views(trainable[0])
            params = [trainable[i] if is_trainable else frozen[i] for is_trainable, i in sources]
            with autocast_or_null(precision, trainable[0].device):
                outputs = module(*inputs, *params)
            loss = outputs[0]
            loss = loss if loss.dim() == 0 else loss.sum()  # a non-scalar loss: ORT's ones seed
            return (loss if loss_scale is None else loss.float() * loss_scale), outputs

        gradients, outputs = torch.func.grad(loss_and_outputs, argnums=0, has_aux=True)(trainable, frozen)
        # data parallel (a reduction): the gradients' average across ranks replaces them
        if fresh_gradients:
            grads = gradients if reduction is None else reduction(gradients)
        else:  # where, not a multiplication by zero: a reset drops inf/NaN left in the gradients
            torch._foreach_copy_(grads, [torch.where(reset, new, old + new) for old, new in zip(grads, gradients)])
            if reduction is not None:
                torch._foreach_copy_(grads, reduction(grads))
        if update is not None:
            if update.clip_max_norm is not None:
                clip_grad_norm_(grads, update.clip_max_norm)
            update.kernel(trainable, grads, *states, scalars, *update.constants)
        return (outputs, grads) if fresh_gradients else outputs

    return precompiled.with_own_code(train_step)
