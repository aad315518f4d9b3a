"""``build_package``: a set of training artifacts compiled ahead of time into a package of steps.

The package is a folder holding one AOTInductor program (itself a folder: ``programs.py``) per step
(``program_build.py``: train, eval, optimizer), ``native_steps.txt`` (``native_description.py``: what the runtime
with no Python reads) and ``manifest.json`` (``manifest.py``), written last: a folder without it is no package.
The axes the ONNX graphs leave symbolic stay dynamic where torch.export can keep them so; else the
programs take the example size (``example_size``) only, and the manifest says which.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import onnx

from ort_torch_train.errors import PackageError
from ort_torch_train.fileio import path_inside
from ort_torch_train.graph.layout import GraphLayout
from ort_torch_train.optim.algorithm import Hyperparameters
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile.step_spec import ParameterPlan
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.forward_models import eval_forward
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.package import exports as exports_of
from ort_torch_train.training.package import program_build as built
from ort_torch_train.training.package.manifest import (
    EVAL,
    OPTIMIZER,
    TRAINING,
    Manifest,
    Program,
    cpu_features_here,
    environment,
    model_digest,
)
from ort_torch_train.training.package.native_description import write_description
from ort_torch_train.training.threads import process_threads

TRAIN_PROGRAM, EVAL_PROGRAM, OPTIMIZER_PROGRAM = "train_step", "eval_step", "optimizer_step"  # program folders
DEFAULT_FOLDER = "package"  # beside the artifacts: where the runtime with no Python looks for a model file's package


def build_package(
    artifacts: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    example_size: int = 8,
    export_outputs: Sequence[Sequence[str]] = (),
) -> Manifest:
    """Compile the artifacts in the folder ``artifacts`` (training_model.onnx and checkpoint, eval_model.onnx
    and optimizer_model.onnx where present) into a package in the folder ``out`` (None: ``artifacts/package``,
    where the runtime with no Python looks for it); return its manifest.

    ``example_size`` is the size the example inputs give each symbolic axis (any size runs where the axis
    stays dynamic). ``export_outputs``: the output sets, besides the eval model's outputs before its loss, that
    the runtime with no Python exports for inference (``exports.py``). Raises PackageError for a folder without
    the training model or checkpoint.
    """
    if not isinstance(example_size, int) or isinstance(example_size, bool) or example_size < 2:
        raise ValueError(f"example_size: expected an int >= 2 (sizes 0 and 1 specialise), got {example_size!r}")
    folder = Path(artifacts)
    out = folder / DEFAULT_FOLDER if out is None else out
    models = {role: _model(folder, role) for role in (TRAINING, EVAL, OPTIMIZER)}
    training_model, eval_model = models[TRAINING], models[EVAL]
    checkpoint = folder / "checkpoint"
    if training_model is None or not checkpoint.is_file():
        raise PackageError(
            f"package: {os.fspath(folder)!r} holds no training_model.onnx and checkpoint "
            "(expected a folder of training artifacts from generate_artifacts)"
        )
    os.makedirs(out, exist_ok=True)
    state = TrainingState.load(checkpoint)
    engine = TrainingEngine(training_model, state, eval_model, EngineOptions.of())
    trainable_names = engine.trainable_parameter_names
    graph_names = list(engine.train_layout.params)
    plan = ParameterPlan.of(graph_names, trainable_names)
    trainable = [state.params[name].detach() for name in trainable_names]
    frozen = [state.params[name].detach() for name in plan.frozen_names(graph_names)]
    params = state.params
    train = built.train_program(
        engine.train_graph,
        params,
        trainable_names,
        path_inside(out, TRAIN_PROGRAM, "package program"),
        built.examples(engine.train_graph, example_size),
    )
    evaluation = None
    if engine.eval_graph is not None:
        path = path_inside(out, EVAL_PROGRAM, "package program")
        evaluation = built.eval_program(
            engine.eval_graph, params, path, built.examples(engine.eval_graph, example_size)
        )

    optimizer: Program | None = None
    hyperparameters: Hyperparameters | None = None
    algorithm: str | None = None
    moments: tuple[str, ...] = ()
    optimizer_model = models[OPTIMIZER]
    if optimizer_model is not None:
        update = built.optimizer_program(
            optimizer_model, trainable, path_inside(out, OPTIMIZER_PROGRAM, "package program")
        )
        optimizer, moments = update.program, update.moments
        algorithm, hyperparameters = update.spec.algorithm.name, update.spec.hyperparameters

    exports = []
    if eval_model is not None:
        sets = exports_of.output_sets(eval_model, list(state.params), export_outputs)
        for index, outputs in enumerate(sets):
            exports.append(_prepared_export(eval_model, state, outputs, index, out, example_size))
    elif export_outputs:
        raise PackageError("package: export_outputs needs an eval model; the artifacts hold none")

    here = environment()
    manifest = Manifest(
        artifacts={role: model_digest(model) for role, model in models.items() if model is not None},
        torch=here["torch"],
        machine=here["machine"],
        cpu_capability=here["cpu_capability"],
        cpu_features=cpu_features_here(),
        trainable=tuple(built.tensor_entry(name, tensor) for name, tensor in zip(trainable_names, trainable)),
        frozen=tuple(built.tensor_entry(name, tensor) for name, tensor in zip(plan.frozen_names(graph_names), frozen)),
        eval_parameters=tuple(engine.eval_layout.params) if engine.eval_layout is not None else (),
        train=train,
        eval=evaluation,
        optimizer=optimizer,
        optimizer_algorithm=algorithm,
        moments=tuple(moments),
    )
    digests = {role: _file_digest(folder / f"{role}.onnx") for role, model in models.items() if model is not None}
    write_description(out, manifest, graph_names, hyperparameters, exports, digests)
    manifest.write(out)
    return manifest


def _prepared_export(
    eval_model: onnx.ModelProto,
    state: TrainingState,
    outputs: Sequence[str],
    index: int,
    out: str | os.PathLike,
    size: int,
) -> tuple[exports_of.ExportTemplate, Program]:
    """The inference export of ``outputs`` prepared: its model with the parameters' ranges, and its graph compiled."""
    template = exports_of.write_template(eval_model, state.params, outputs, out, f"export_{index}.onnx")
    names = [entry.name for entry in template.parameters]
    layout = GraphLayout(user_inputs=template.inputs, params=tuple(names), user_outputs=tuple(outputs))
    graph = eval_forward(eval_model, layout, EngineOptions.of(), {}, None, process_threads())
    path = path_inside(out, f"export_{index}", "package")
    return template, built.eval_program(graph, state.params, path, built.examples(graph, size))


def _file_digest(path: Path) -> str:
    """The sha1 of the file's bytes, as the runtime with no Python checks a model file given it."""
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _model(folder: Path, role: str) -> onnx.ModelProto | None:
    path = folder / f"{role}.onnx"
    return onnx.load(os.fspath(path)) if path.is_file() else None
