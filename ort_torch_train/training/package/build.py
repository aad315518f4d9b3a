"""``build_package``: a set of training artifacts compiled ahead of time into a package of steps.

The package is a folder holding one AOTInductor program per step (``programs.py``: train, eval,
optimizer), ``native_steps.txt`` (``native_description.py``: what the runtime with no Python reads) and
``manifest.json`` (``manifest.py``), written last: a folder without it is no package.
The axes the ONNX graphs leave symbolic stay dynamic where torch.export can keep them so; else the
programs take the example size (``example_size``) only, and the manifest says which.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx
import torch
from torch import Tensor

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import PackageError
from ort_torch_train.fileio import path_inside
from ort_torch_train.graph.layout import GraphLayout
from ort_torch_train.optim.algorithm import Hyperparameters
from ort_torch_train.optim.compiled import scalar_tensor
from ort_torch_train.optim.optimizer_model import read_optimizer_model
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile.step_spec import ParameterPlan
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.forward_models import eval_forward
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.package import exports as exports_of
from ort_torch_train.training.package import programs
from ort_torch_train.training.package.manifest import (
    EVAL,
    OPTIMIZER,
    TRAINING,
    Manifest,
    Program,
    TensorEntry,
    cpu_features_here,
    environment,
    model_digest,
)
from ort_torch_train.training.package.native_description import write_description
from ort_torch_train.training.threads import process_threads

log = logging.getLogger(__name__)
TRAIN_FILE, EVAL_FILE, OPTIMIZER_FILE = "train_step.pt2", "eval_step.pt2", "optimizer_step.pt2"
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

    inputs, axes, entries = _examples(engine.train_graph, example_size)
    module = _converted(engine.train_graph, inputs, [state.params[name] for name in graph_names])
    train_step = programs.train_function(module, len(inputs), plan)
    example = [*inputs, *trainable, *frozen, *(torch.zeros_like(t) for t in trainable), torch.tensor(True)]
    fixed = [None] * (len(example) - len(inputs))
    entries = _compile(train_step, example, axes, fixed, entries, path_inside(out, TRAIN_FILE, "package program"))
    train = Program(TRAIN_FILE, entries, tuple(engine.train_layout.user_outputs))

    evaluation = None
    if engine.eval_graph is not None and engine.eval_layout is not None:
        params = [state.params[name] for name in engine.eval_layout.params]
        inputs, axes, entries = _examples(engine.eval_graph, example_size)
        eval_step = programs.eval_function(_converted(engine.eval_graph, inputs, params))
        example = [*inputs, *(p.detach() for p in params)]
        path = path_inside(out, EVAL_FILE, "package program")
        entries = _compile(eval_step, example, axes, [None] * len(params), entries, path)
        evaluation = Program(EVAL_FILE, entries, tuple(engine.eval_layout.user_outputs))

    optimizer: Program | None = None
    hyperparameters: Hyperparameters | None = None
    algorithm: str | None = None
    moments: tuple[str, ...] = ()
    optimizer_model = models[OPTIMIZER]
    if optimizer_model is not None:
        spec = read_optimizer_model(optimizer_model)
        algorithm, moments = spec.algorithm.name, spec.algorithm.updated_moments
        hyperparameters = spec.hyperparameters
        update = spec.algorithm.fused_update(spec.hyperparameters, spec.clip_max_norm)
        scalars = scalar_tensor(spec.algorithm.step_scalars(spec.hyperparameters, 1), torch.device("cpu"))
        optimizer_step = programs.optimizer_function(update, len(trainable), len(moments))
        example = [*trainable, *(torch.zeros_like(t) for _ in range(1 + len(moments)) for t in trainable), scalars]
        programs.compile_program(
            programs.export_step(optimizer_step, example, [None] * len(example)),
            path_inside(out, OPTIMIZER_FILE, "package program"),
        )
        entry = TensorEntry("scalars", dtype_name(scalars.dtype), tuple(scalars.shape))
        optimizer = Program(OPTIMIZER_FILE, (entry,), ())

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
        trainable=tuple(_entry(name, tensor) for name, tensor in zip(trainable_names, trainable)),
        frozen=tuple(_entry(name, tensor) for name, tensor in zip(plan.frozen_names(graph_names), frozen)),
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
    params = [state.params[name].detach() for name in names]
    inputs, axes, entries = _examples(graph, size)
    step = programs.eval_function(_converted(graph, inputs, params))
    file = f"export_{index}.pt2"
    entries = _compile(step, [*inputs, *params], axes, [None] * len(params), entries, path_inside(out, file, "package"))
    return template, Program(file, entries, tuple(outputs))


def _file_digest(path: Path) -> str:
    """The sha1 of the file's bytes, as the runtime with no Python checks a model file given it."""
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _model(folder: Path, role: str) -> onnx.ModelProto | None:
    path = folder / f"{role}.onnx"
    return onnx.load(os.fspath(path)) if path.is_file() else None


def _converted(
    graph: ForwardGraph, inputs: Sequence[Tensor], params: Sequence[Tensor]
) -> Callable[..., Sequence[Tensor]]:
    """``graph`` converted for ``inputs``, its literals that follow the sizes of dynamic axes made expressions of
    those sizes (``ForwardGraph.eager_module``), so that the export can keep the axes dynamic."""
    return graph.specialised(inputs, params, "package", graph.eager_module, dynamic=True)


def _entry(name: str, tensor: Tensor) -> TensorEntry:
    return TensorEntry(name, dtype_name(tensor.dtype), tuple(tensor.shape))


def _examples(graph: ForwardGraph, size: int) -> tuple[list[Tensor], list[programs.AxisSizes], tuple[TensorEntry, ...]]:
    """Zero example inputs of ``graph`` (``size`` for each symbolic axis), the dynamic axes torch.export takes
    for them (one dimension per symbolic name) and their manifest entries (None for a dynamic axis)."""
    dimensions: dict[str, torch.export.Dim] = {}
    inputs, axes, entries = [], [], []
    for declaration in graph.declarations:
        if declaration.dims is None:
            raise PackageError(f"package: input {declaration.name!r} has no declared rank; a package needs one")
        shape = [dim if isinstance(dim, int) else size for dim in declaration.dims]
        inputs.append(torch.zeros(shape, dtype=declaration.dtype))
        symbolic = {
            axis: dimensions.setdefault(
                dim or f"{declaration.name}_{axis}", programs.dimension(dim or declaration.name)
            )
            for axis, dim in enumerate(declaration.dims)
            if not isinstance(dim, int)
        }
        axes.append(symbolic or None)
        entries.append(
            TensorEntry(
                declaration.name,
                dtype_name(declaration.dtype),
                tuple(None if axis in symbolic else extent for axis, extent in enumerate(shape)),
            )
        )
    return inputs, axes, tuple(entries)


def _compile(
    function: Callable[..., tuple],
    example: Sequence[Tensor],
    axes: Sequence[programs.AxisSizes],
    fixed: Sequence[programs.AxisSizes],
    entries: tuple[TensorEntry, ...],
    path: Path,
) -> tuple[TensorEntry, ...]:
    """Export ``function`` with its inputs' ``axes`` dynamic (else, where torch cannot keep them so, all
    fixed) and compile it into ``path``; return the inputs' entries as compiled."""
    try:
        program = programs.export_step(function, example, [*axes, *fixed])
    except Exception as error:  # torch's many tracing errors: the fixed-shape step still serves
        if not any(axes):
            raise
        log.warning("package: the axes %s cannot stay dynamic (%s); compiling for the example shapes", axes, error)
        program = programs.export_step(function, example, [None] * len(example))
        entries = tuple(TensorEntry(e.name, e.dtype, tuple(t.shape)) for e, t in zip(entries, example[: len(entries)]))
    programs.compile_program(program, path)
    return entries
