"""A package's train and optimizer programs bound to a TrainingState's tensors, for the Python faces' steps.

A program takes the state's tensors as arguments and updates them in place. ``StateArguments`` assembles them, in
the program's order, once per state generation and checks them at each call against what it assembled: the same
generation (moments replaced start a new one), the same parameter storage (``param.data = ...`` replaces it behind
the state's back) and the same gradient tensors; anything else assembles them again, checked against the manifest.
``BoundTrainStep`` checks a step's inputs in full once per input signature (dtypes and shapes) and then only what
the signature does not hold.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import InputError, InputTypeError, PackageError
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.package.manifest import Program, TensorEntry

Runner = Callable[[list[Tensor]], list[Tensor]]  # a loaded program: the flat list of its arguments in, its outputs out
SIGNATURES_HELD = 64  # input signatures a train step remembers as checked; more: it forgets them and starts again


class StateArguments:
    """The state's ``trainable`` and ``frozen`` parameters (as ``entries`` describe them), the trainable ones'
    gradients and their ``moments`` (names in the optimizer group), in that order, for a program of the package in
    ``folder``; ``action`` names the step in the error for a nominal state."""

    def __init__(
        self,
        folder: Path,
        state: TrainingState,
        entries: Sequence[TensorEntry],
        trainable: int,
        action: str,
        moments: Sequence[str] = (),
    ) -> None:
        self._folder = folder
        self._action = action
        self._state = state
        self._entries = tuple(entries)
        self._trainable = trainable
        self._moments = tuple(moments)
        self._generation: int | None = None
        self._held: list[tuple[Tensor, int, object]] = []  # (parameter, its data pointer, its gradient)
        self.tensors: list[Tensor] = []

    def current(self) -> list[Tensor]:
        """The program's state arguments, assembled again where the state's tensors changed since the last call."""
        state = self._state
        if self._generation != state.generation:
            return self._assemble()
        for param, pointer, grad in self._held:
            if param.data_ptr() != pointer or param.grad is not grad:
                return self._assemble()
        return self.tensors

    def _assemble(self) -> list[Tensor]:
        state = self._state
        state.require_loaded(self._action)
        params = [state.params[entry.name] for entry in self._entries]
        for entry, param in zip(self._entries, params):
            if (
                tuple(param.shape) != entry.shape
                or dtype_name(param.dtype) != entry.dtype
                or param.device.type != "cpu"
            ):
                raise PackageError(
                    f"package {os.fspath(self._folder)!r}: parameter {entry.name!r} is {entry.dtype} "
                    f"{list(entry.shape)} on the CPU in the package, now {dtype_name(param.dtype)} "
                    f"{list(param.shape)} on {param.device} in the state"
                )
        trainable = params[: self._trainable]
        grads = []
        for entry, param in zip(self._entries, trainable):
            if param.grad is None or param.grad.shape != param.shape or param.grad.dtype != param.dtype:
                raise PackageError(
                    f"package {os.fspath(self._folder)!r}: trainable parameter {entry.name!r} has no gradient buffer "
                    "of its shape and dtype"
                )
            grads.append(param.grad)
        moments: list[Tensor] = []
        if self._moments:  # the optimizer engine made them; replacing them starts a new generation
            held = state.optimizer.momentums if state.optimizer is not None else {}
            groups = [held[entry.name] for entry in self._entries[: self._trainable]]
            moments = [group[moment] for moment in self._moments for group in groups]
        tensors = [*(param.detach() for param in params), *grads, *moments]
        require_contiguous(tensors, "a packaged step")
        self._held = [(param, param.data_ptr(), param.grad) for param in params]
        self._generation = state.generation
        self.tensors = tensors
        return tensors


class BoundTrainStep:
    """The package's train ``program`` (``run``) over the state's parameters and gradients: ``step(inputs, reset)``
    replaces (``reset``) or adds to the gradients, updates the frozen parameters a forward changes, in place, and
    returns the outputs."""

    def __init__(self, folder: Path, program: Program, run: Runner, arguments: StateArguments) -> None:
        self._folder = folder
        self._program = program
        self._run = run
        self._arguments = arguments
        self._flags = ([torch.tensor(False)], [torch.tensor(True)])
        self._output_count = len(program.outputs)
        self._signatures: set[tuple] = set()  # the input dtypes and shapes checked in full

    def __call__(self, inputs: list[Tensor], reset: bool) -> tuple[Tensor, ...]:
        signature: tuple = ()
        for tensor in inputs:  # exact CPU tensors, contiguous: their dtypes and shapes say whether they were checked
            if type(tensor) is not Tensor or not tensor.is_cpu or not tensor.is_contiguous():
                inputs = self._checked(inputs, None)
                break
            signature += (tensor.dtype, tensor.shape)
        else:
            if signature not in self._signatures:
                inputs = self._checked(inputs, signature)
        returned = self._run(inputs + self._arguments.current() + self._flags[reset])
        if len(returned) != self._output_count:
            raise PackageError(
                f"package {os.fspath(self._folder)!r}: the train program returned {len(returned)} tensors"
            )
        return tuple(returned)

    def _checked(self, inputs: list[Tensor], signature: tuple | None) -> list[Tensor]:
        cpu = [t.cpu() if isinstance(t, Tensor) and not t.is_cpu else t for t in inputs]  # as the other steps move them
        checked = checked_inputs(self._program, cpu, "TrainStep")
        if signature is not None:
            if len(self._signatures) >= SIGNATURES_HELD:
                self._signatures.clear()
            self._signatures.add(signature)
        return checked


class BoundUpdate:
    """The package's optimizer ``program`` (``run``) over the state's trainable parameters, gradients and moments:
    ``update(scalars)`` updates the parameters and moments in place (``OptimizerEngine``'s ``UpdateProgram``)."""

    def __init__(self, program: Program, run: Runner, arguments: StateArguments) -> None:
        self._program = program
        self._run = run
        self._arguments = arguments
        self._state: list[Tensor] = []
        self._call: list[Tensor] = []  # the state's arguments and the scalars, as the last call passed them

    def __call__(self, scalars: Tensor) -> None:
        state = self._arguments.current()
        call = self._call
        if state is not self._state or call[-1] is not scalars:
            (scalars,) = checked_inputs(self._program, [scalars], "OptimizerStep")
            call = self._call = [*state, scalars]
            self._state = state
        self._run(call)


def require_contiguous(tensors: Sequence[Tensor], what: str) -> None:
    """The programs write the parameters, gradients, moments and frozen statistics in place, as contiguous tensors."""
    for tensor in tensors:
        if not tensor.is_contiguous():
            raise InputError(
                f"{what}: a packaged step updates its state in place; got a non-contiguous {list(tensor.shape)} tensor"
            )


def checked_inputs(program: Program, inputs: Sequence[Tensor], what: str) -> list[Tensor]:
    """``inputs``, contiguous; InputError naming the first whose count, dtype, rank or fixed size the program
    does not take, or that is not on the CPU."""
    if len(inputs) != len(program.inputs):
        raise InputError(
            f"{what}: expected {len(program.inputs)} inputs {[e.name for e in program.inputs]}, got {len(inputs)}"
        )
    for entry, tensor in zip(program.inputs, inputs):
        if not isinstance(tensor, Tensor):
            raise InputTypeError(f"{what}: input {entry.name!r}: expected a tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise InputError(
                f"{what}: input {entry.name!r}: a package runs on the CPU, got a tensor on {tensor.device}"
            )
        if dtype_name(tensor.dtype) != entry.dtype or not _fits(entry, tuple(tensor.shape)):
            shape = ["any" if axis is None else axis for axis in entry.shape]
            raise InputError(
                f"{what}: input {entry.name!r}: the package takes {entry.dtype} {shape}, got "
                f"{dtype_name(tensor.dtype)} {list(tensor.shape)}"
            )
    return [tensor if tensor.is_contiguous() else tensor.contiguous() for tensor in inputs]


def _fits(entry: TensorEntry, shape: tuple[int, ...]) -> bool:
    return len(shape) == len(entry.shape) and all(
        (axis is None and size >= 1) or axis == size for axis, size in zip(entry.shape, shape)
    )
