"""``PackagedSteps``: the steps of a package (``build.py``) loaded and run, with no compilation.

Loading checks the manifest first (``manifest.py``): the torch, the CPU and the artifacts must be
those the package was built for, and the parameters those it takes. The train and optimizer steps are bound to a
TrainingState's tensors (``bound.py``), which their programs update in place (gradients, BatchNorm statistics,
parameters and moments); each step checks its inputs against the manifest (dtype, rank, fixed sizes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
from torch import Tensor

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import PackageError
from ort_torch_train.fileio import path_inside
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.torch_internals import aoti_package_runner
from ort_torch_train.training.package.bound import (
    BoundTrainStep,
    BoundUpdate,
    ProgramBinding,
    Runner,
    checked_inputs,
)
from ort_torch_train.training.package.manifest import (
    EVAL,
    OPTIMIZER,
    TRAINING,
    Manifest,
    Program,
    check_artifacts,
    check_environment,
    model_digest,
)

if TYPE_CHECKING:
    from ort_torch_train.training.forward_graph import ForwardGraph

PACKAGE_PREFIX = "package:"


def package_folder(compile: object) -> PackageFolder | None:
    """The package of a ``compile="package:DIR"`` setting, else None; ValueError for one naming no folder."""
    if not isinstance(compile, str) or not compile.startswith(PACKAGE_PREFIX):
        return None
    folder = compile[len(PACKAGE_PREFIX) :]
    if not folder:
        raise ValueError(f"compile: {compile!r} names no folder; expected 'package:DIR' (a package's folder)")
    return PackageFolder(Path(folder))


@dataclass(frozen=True)
class PackageFolder:
    """The steps' programs of the package in ``folder`` (a ``ProgramsSource``)."""

    folder: Path

    def open(
        self,
        training_model: onnx.ModelProto,
        eval_model: onnx.ModelProto | None,
        graphs: tuple[ForwardGraph, ForwardGraph | None],
        state: TrainingState,
        trainable: list[str],
    ) -> PackagedSteps:
        """The package's steps, checked against these models and parameters."""
        return PackagedSteps(self.folder, training_model, eval_model, state.params, trainable)


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
        self._binding = ProgramBinding(self.folder, (*manifest.trainable, *manifest.frozen), len(manifest.trainable))
        self._train = self._load(manifest.train)
        self._eval = None if manifest.eval is None else self._load(manifest.eval)
        self._optimizer = None if manifest.optimizer is None else self._load(manifest.optimizer)

    def _load(self, program: Program) -> Runner:
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

    def bind_train(self, state: TrainingState) -> BoundTrainStep:
        """The train step over ``state``'s parameters and gradients (those this package was checked against)."""
        return self._binding.train(state, self.manifest.train, self._train)

    def bind_update(self, state: TrainingState, optimizer_model: onnx.ModelProto) -> BoundUpdate | None:
        """The optimizer step over ``state``'s trainable parameters, gradients and moments, where this package's
        optimizer program was built from ``optimizer_model``; None where it was not (or holds none)."""
        manifest = self.manifest
        if self._optimizer is None or manifest.optimizer is None:
            return None
        if manifest.artifacts.get(OPTIMIZER) != model_digest(optimizer_model):
            return None
        return self._binding.update(state, manifest.optimizer, self._optimizer, manifest.moments)

    def eval_step(self, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The eval graph's outputs."""
        if self._eval is None or self.manifest.eval is None:
            raise PackageError(f"package {os.fspath(self.folder)!r} holds no eval step")
        inputs = checked_inputs(self.manifest.eval, inputs, "EvalStep")
        return tuple(self._eval([*inputs, *params]))
