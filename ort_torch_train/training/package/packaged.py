"""``PackagedSteps``: the steps of a package (``build.py``) loaded and run, with no compilation.

Loading checks the manifest first (``manifest.py``): the torch, the CPU and the artifacts must be
those the package was built for, and the parameters those it takes. Each step checks its inputs
against the manifest (dtype, rank, fixed sizes) and copies the tensors the program returns over the
caller's (gradients, BatchNorm statistics, parameters and moments), in place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import onnx
import torch
from torch import Tensor

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import InputError, InputTypeError, PackageError
from ort_torch_train.fileio import path_inside
from ort_torch_train.torch_internals import aoti_package_runner
from ort_torch_train.training.package.manifest import (
    EVAL,
    TRAINING,
    Manifest,
    Program,
    TensorEntry,
    check_artifacts,
    check_environment,
)

PACKAGE_PREFIX = "package:"


def package_folder(compile: object) -> Path | None:
    """The folder of a ``compile="package:DIR"`` setting, else None; ValueError for one naming no folder."""
    if not isinstance(compile, str) or not compile.startswith(PACKAGE_PREFIX):
        return None
    folder = compile[len(PACKAGE_PREFIX) :]
    if not folder:
        raise ValueError(f"compile: {compile!r} names no folder; expected 'package:DIR' (a package's folder)")
    return Path(folder)


class PackagedSteps:
    """The train, eval and optimizer steps of the package in ``folder``, for the models given (checked
    against the ones it was built from), the parameters ``state_tensors`` (name -> tensor) holds and the
    ``trainable`` ones among them (in the training graph's order)."""

    def __init__(
        self,
        folder: str | os.PathLike,
        training_model: onnx.ModelProto,
        eval_model: onnx.ModelProto | None,
        state_tensors: Mapping[str, Tensor],
        trainable: Sequence[str],
    ) -> None:
        self.folder = Path(folder)
        manifest = Manifest.read(self.folder)
        check_environment(manifest, self.folder)
        check_artifacts(manifest, self.folder, {TRAINING: training_model, EVAL: eval_model})
        if eval_model is not None and manifest.eval is None:
            raise PackageError(f"package {os.fspath(folder)!r} holds no eval step; build it with the eval model")
        for entry in (*manifest.trainable, *manifest.frozen):
            tensor = state_tensors.get(entry.name)
            if tensor is None or tuple(tensor.shape) != entry.shape or dtype_name(tensor.dtype) != entry.dtype:
                found = "none" if tensor is None else f"{dtype_name(tensor.dtype)} {list(tensor.shape)}"
                raise PackageError(
                    f"package {os.fspath(folder)!r}: parameter {entry.name!r} is {entry.dtype} {list(entry.shape)} "
                    f"in the package, {found} in the checkpoint state"
                )
        built = [entry.name for entry in manifest.trainable]
        if built != list(trainable):
            raise PackageError(
                f"package {os.fspath(folder)!r} trains the parameters {built}; these artifacts and state train "
                f"{list(trainable)}"
            )
        self.manifest = manifest
        self._train = self._load(manifest.train)
        self._eval = None if manifest.eval is None else self._load(manifest.eval)
        self._optimizer = None if manifest.optimizer is None else self._load(manifest.optimizer)
        self._flags = (torch.tensor(False), torch.tensor(True))

    def _load(self, program: Program) -> Callable[[list[Tensor]], list[Tensor]]:
        path = path_inside(self.folder, program.file, "package program")
        try:
            return aoti_package_runner(os.fspath(path))
        except Exception as error:  # a damaged or foreign file: torch's loader raises many kinds
            raise PackageError(f"package {os.fspath(self.folder)!r}: cannot load {program.file!r}: {error}") from None

    @property
    def trainable_names(self) -> list[str]:
        """The trainable parameters' names, in the order the steps take them."""
        return [entry.name for entry in self.manifest.trainable]

    @property
    def frozen_names(self) -> list[str]:
        """The frozen parameters' names, in the order the train step takes them."""
        return [entry.name for entry in self.manifest.frozen]

    def train_step(
        self,
        inputs: Sequence[Tensor],
        trainable: Sequence[Tensor],
        frozen: Sequence[Tensor],
        grads: Sequence[Tensor],
        reset: bool,
    ) -> tuple[Tensor, ...]:
        """Forward and backward: ``grads`` replaced (``reset``) or added to, ``frozen`` updated, in place; the
        outputs."""
        program = self.manifest.train
        inputs = _checked_inputs(program, inputs, "TrainStep")
        state = [*trainable, *frozen, *grads]
        _require_contiguous(state, "TrainStep")
        returned = self._train([*inputs, *state, self._flags[bool(reset)]])
        if len(returned) != len(program.outputs):
            raise PackageError(
                f"package {os.fspath(self.folder)!r}: the train program returned {len(returned)} tensors"
            )
        return tuple(returned)

    def eval_step(self, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The eval graph's outputs."""
        if self._eval is None or self.manifest.eval is None:
            raise PackageError(f"package {os.fspath(self.folder)!r} holds no eval step")
        inputs = _checked_inputs(self.manifest.eval, inputs, "EvalStep")
        return tuple(self._eval([*inputs, *params]))

    def optimizer_step(
        self, params: Sequence[Tensor], grads: Sequence[Tensor], moments: Sequence[Sequence[Tensor]], scalars: Tensor
    ) -> None:
        """One update of ``params`` and ``moments`` (one list per name of ``manifest.moments``) in place, the
        gradients clipped in place where the optimizer model clips; ``scalars`` are the step's
        (``OptimizerAlgorithm.step_scalars``)."""
        if self._optimizer is None or self.manifest.optimizer is None:
            raise PackageError(f"package {os.fspath(self.folder)!r} holds no optimizer step")
        (scalars,) = _checked_inputs(self.manifest.optimizer, [scalars], "OptimizerStep")
        state = [*params, *grads, *(tensor for moment in moments for tensor in moment)]
        _require_contiguous(state, "OptimizerStep")
        if self._optimizer([*state, scalars]):
            raise PackageError(f"package {os.fspath(self.folder)!r}: the optimizer program returned tensors")


def _require_contiguous(tensors: Sequence[Tensor], what: str) -> None:
    """The programs write the parameters, gradients, moments and frozen statistics in place, as contiguous tensors."""
    for tensor in tensors:
        if not tensor.is_contiguous():
            raise InputError(
                f"{what}: a packaged step updates its state in place; got a non-contiguous {list(tensor.shape)} tensor"
            )


def _checked_inputs(program: Program, inputs: Sequence[Tensor], what: str) -> list[Tensor]:
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
