"""A package's train and optimizer programs bound to a TrainingState's tensors, for the Python faces' steps.

A program takes the state's tensors as arguments and updates them in place. ``StateArguments``, one per state that
both programs share (``ProgramBinding``), assembles them in the programs' order once per state generation and checks
them at each call against what it assembled: the same generation (moments replaced start a new one), the same
parameter storage (``param.data = ...`` replaces it behind the state's back) and the same gradient tensors; anything
else assembles them again, checked against the manifest. The optimizer program takes the state's flat buffers
(``TrainingState.flat_view``: params, grads, each moment), as the OptimizerEngine's kernels do.
``BoundTrainStep`` checks a step's inputs in full once per input signature (dtypes and shapes) and then only what
the signature does not hold.
"""

from __future__ import annotations

import os
import weakref
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
    """The state's ``trainable`` and ``frozen`` parameters (as ``entries`` describe them) and the trainable ones'
    gradients, in that order, for the train program of the package in ``folder``; and the flat buffers of the
    trainable parameters, gradients and moments for its optimizer program."""

    def __init__(self, folder: Path, state: TrainingState, entries: Sequence[TensorEntry], trainable: int) -> None:
        self._folder = folder
        self._state = state
        self._entries = tuple(entries)
        self._trainable = trainable
        self._generation: int | None = None
        self._held: list[tuple[Tensor, int, object]] = []  # (parameter, its data pointer, its gradient)
        self._train: list[Tensor] = []
        self._update: list[Tensor] | None = None  # params, grads, moments: flat
        self._moments: tuple[str, ...] | None = None  # the moments _update holds

    def train(self) -> list[Tensor]:
        """The train program's state arguments, assembled again where the state's tensors changed."""
        if not self._still_current():
            self._assemble(None, "perform TrainStep")
        return self._train

    def update(self, moments: tuple[str, ...]) -> list[Tensor]:
        """The optimizer program's state arguments (flat params, grads and each of ``moments``), assembled again
        where the state's tensors changed."""
        if self._update is None or self._moments != moments or not self._still_current():
            self._assemble(moments, "perform OptimizerStep")
        assert self._update is not None
        return self._update

    def _still_current(self) -> bool:
        if self._generation != self._state.generation:
            return False
        for param, pointer, grad in self._held:
            if param.data_ptr() != pointer or param.grad is not grad:
                return False
        return True

    def _assemble(self, moments: tuple[str, ...] | None, action: str) -> None:
        state = self._state
        state.require_loaded(action)
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
        for entry, param in zip(self._entries, params[: self._trainable]):
            if param.grad is None or param.grad.shape != param.shape or param.grad.dtype != param.dtype:
                raise PackageError(
                    f"package {os.fspath(self._folder)!r}: trainable parameter {entry.name!r} has no gradient buffer "
                    "of its shape and dtype"
                )
        update = None
        if moments is not None:  # moves the tensors into flat buffers where they are not (a new generation)
            names = [entry.name for entry in self._entries[: self._trainable]]
            flat = state.flat_view(names, moments)
            if flat is None:
                raise PackageError(
                    f"package {os.fspath(self._folder)!r}: the optimizer program takes the trainable parameters, "
                    "gradients and moments as one flat buffer each; these cannot share one (mixed dtypes or devices)"
                )
            update = [flat.params, flat.grads, *flat.moments]
        grads = [param.grad for param in params[: self._trainable] if param.grad is not None]
        tensors = [*(param.detach() for param in params), *grads]
        require_contiguous(tensors, "a packaged step")
        self._held = [(param, param.data_ptr(), param.grad) for param in params]
        self._generation = state.generation
        self._train = tensors
        self._update = update  # a train step's assembly drops it: the next update assembles it again
        self._moments = moments


class ProgramBinding:
    """The train and optimizer programs of the package (or ``compile="aot"`` programs) in ``folder``, bound to
    states: both programs bound to one state share its ``StateArguments``. ``entries``: the trainable, then the
    frozen parameters; ``trainable``: how many are trainable."""

    def __init__(self, folder: Path, entries: Sequence[TensorEntry], trainable: int) -> None:
        self._folder = folder
        self._entries = tuple(entries)
        self._trainable = trainable
        self._arguments: weakref.WeakKeyDictionary[TrainingState, StateArguments] = weakref.WeakKeyDictionary()

    def _of(self, state: TrainingState) -> StateArguments:
        arguments = self._arguments.get(state)
        if arguments is None:
            arguments = self._arguments[state] = StateArguments(self._folder, state, self._entries, self._trainable)
        return arguments

    def train(self, state: TrainingState, program: Program, run: Runner) -> BoundTrainStep:
        """The train ``program`` (``run``) over ``state``'s parameters and gradients."""
        return BoundTrainStep(self._folder, program, run, self._of(state))

    def update(self, state: TrainingState, program: Program, run: Runner, moments: Sequence[str]) -> BoundUpdate:
        """The optimizer ``program`` (``run``) over ``state``'s flat parameters, gradients and ``moments``."""
        return BoundUpdate(program, run, self._of(state), tuple(moments))


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
        returned = self._run(inputs + self._arguments.train() + self._flags[reset])
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
    """The package's optimizer ``program`` (``run``) over the state's flat trainable parameters, gradients and
    ``moments``: ``update(scalars)`` updates the parameters and moments in place (``OptimizerEngine``'s
    ``UpdateProgram``)."""

    def __init__(self, program: Program, run: Runner, arguments: StateArguments, moments: tuple[str, ...]) -> None:
        self._program = program
        self._run = run
        self._arguments = arguments
        self._moments = moments
        self._state: list[Tensor] = []
        self._call: list[Tensor] = []  # the state's arguments and the scalars, as the last call passed them

    def __call__(self, scalars: Tensor) -> None:
        state = self._arguments.update(self._moments)
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
