"""One step program compiled ahead of time: the train, eval or optimizer program of a package (``build.py``) or of
``compile="aot"`` (``training/compile/ahead.py``), from a converted graph and the parameters it takes.

The axes the ONNX graph leaves symbolic and the graph's ``dynamic`` setting selects stay dynamic where torch.export
can keep them so; else the program takes the example sizes only, and its ``Program`` entries say which (None: any
size). A symbolic axis the setting leaves fixed takes the size of the inputs given, else the example size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import Tensor

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import InputError, PackageError
from ort_torch_train.optim.compiled import scalar_tensor
from ort_torch_train.optim.optimizer_model import OptimizerSpec, read_optimizer_model
from ort_torch_train.training.compile.step_spec import ParameterPlan
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.package import programs
from ort_torch_train.training.package.manifest import Program, TensorEntry

log = logging.getLogger(__name__)
EXAMPLE_SIZE = 8  # the size example inputs give each dynamic axis (sizes 0 and 1 specialise)


@dataclass(frozen=True)
class Examples:
    """Example inputs of a graph, the dynamic axes torch.export takes for them (one dimension per symbolic name)
    and their program entries (None for a dynamic axis)."""

    inputs: list[Tensor]
    axes: list[programs.AxisSizes]
    entries: tuple[TensorEntry, ...]


@dataclass(frozen=True)
class OptimizerProgram:
    """A compiled optimizer program, the optimizer model it was built from and the moments it updates."""

    program: Program
    spec: OptimizerSpec
    moments: tuple[str, ...]


def examples(graph: ForwardGraph, size: int = EXAMPLE_SIZE, given: Sequence[Tensor] | None = None) -> Examples:
    """Zero example inputs of ``graph``: ``size`` for each symbolic axis its ``dynamic`` setting lets vary, the
    size in ``given`` (the first inputs a step takes; None: ``size``) for the other symbolic axes."""
    dimensions: dict[str, torch.export.Dim] = {}
    inputs, axes, entries = [], [], []
    setting = graph.dynamic
    for position, declaration in enumerate(graph.declarations):
        if declaration.dims is None:
            raise PackageError(f"package: input {declaration.name!r} has no declared rank; a package needs one")
        shown = None if given is None or position >= len(given) else given[position]
        if shown is not None and (not isinstance(shown, Tensor) or shown.dim() != len(declaration.dims)):
            found = f"rank {shown.dim()}" if isinstance(shown, Tensor) else type(shown).__name__
            raise InputError(
                f"input {declaration.name!r}: expected a tensor of rank {len(declaration.dims)}, got {found}"
            )
        varying = {
            axis
            for axis, dim in enumerate(declaration.dims)
            if not isinstance(dim, int)
            and (setting is True or (isinstance(setting, dict) and axis in setting.get(declaration.name, ())))
        }
        shape = [
            dim if isinstance(dim, int) else size if axis in varying or shown is None else int(shown.shape[axis])
            for axis, dim in enumerate(declaration.dims)
        ]
        inputs.append(torch.zeros(shape, dtype=declaration.dtype))
        symbolic = {
            axis: dimensions.setdefault(
                dim or f"{declaration.name}_{axis}", programs.dimension(dim or declaration.name)
            )
            for axis, dim in enumerate(declaration.dims)
            if axis in varying and not isinstance(dim, int)
        }
        axes.append(symbolic or None)
        entries.append(
            TensorEntry(
                declaration.name,
                dtype_name(declaration.dtype),
                tuple(None if axis in symbolic else extent for axis, extent in enumerate(shape)),
            )
        )
    return Examples(inputs, axes, tuple(entries))


def train_program(
    graph: ForwardGraph,
    params: Mapping[str, Tensor],
    trainable_names: Sequence[str],
    path: Path,
    example: Examples,
) -> Program:
    """Compile the train step of ``graph`` over ``params`` (the state's tensors by name), ``trainable_names``
    trained, the others frozen, into the program folder ``path``."""
    graph_names = list(graph.layout.params)
    plan = ParameterPlan.of(graph_names, trainable_names)
    trainable = [params[name].detach() for name in trainable_names]
    frozen = [params[name].detach() for name in plan.frozen_names(graph_names)]
    module = converted(graph, example.inputs, [params[name] for name in graph_names])
    step = programs.train_function(module, len(example.inputs), plan)
    arguments = [*example.inputs, *trainable, *frozen, *(torch.zeros_like(t) for t in trainable), torch.tensor(True)]
    fixed = [None] * (len(arguments) - len(example.inputs))
    entries = _compile(step, arguments, example.axes, fixed, example.entries, path)
    return Program(path.name, entries, tuple(graph.layout.user_outputs))


def eval_program(graph: ForwardGraph, params: Mapping[str, Tensor], path: Path, example: Examples) -> Program:
    """Compile the forward of ``graph`` over ``params`` (the state's tensors by name) into the program folder
    ``path``."""
    held = [params[name].detach() for name in graph.layout.params]
    step = programs.eval_function(converted(graph, example.inputs, held))
    entries = _compile(step, [*example.inputs, *held], example.axes, [None] * len(held), example.entries, path)
    return Program(path.name, entries, tuple(graph.layout.user_outputs))


def optimizer_program(optimizer_model: onnx.ModelProto, trainable: Sequence[Tensor], path: Path) -> OptimizerProgram:
    """Compile the optimizer model's update of the ``trainable`` tensors, laid end to end in one flat tensor per
    list (params, grads, each moment), into the program folder ``path``; PackageError where they do not share one
    dtype or the update is not elementwise."""
    spec = read_optimizer_model(optimizer_model)
    algorithm = spec.algorithm
    dtypes = sorted({dtype_name(tensor.dtype) for tensor in trainable})
    if len(dtypes) != 1 or not algorithm.elementwise:
        found = f"dtypes {dtypes}" if len(dtypes) != 1 else f"a {algorithm.name} update that is not elementwise"
        raise PackageError(
            f"package: the optimizer program updates the trainable parameters as one flat tensor; expected one "
            f"dtype and an elementwise update, got {found}"
        )
    moments = algorithm.updated_moments
    update = algorithm.fused_update(spec.hyperparameters, spec.clip_max_norm)
    scalars = scalar_tensor(algorithm.step_scalars(spec.hyperparameters, 1), torch.device("cpu"))
    step = programs.optimizer_function(update, len(moments))
    flat = torch.cat([tensor.detach().reshape(-1) for tensor in trainable])
    example = [flat, *(torch.zeros_like(flat) for _ in range(1 + len(moments))), scalars]
    programs.compile_program(programs.export_step(step, example, [None] * len(example)), path)
    entry = TensorEntry("scalars", dtype_name(scalars.dtype), tuple(scalars.shape))
    return OptimizerProgram(Program(path.name, (entry,), ()), spec, tuple(moments))


def tensor_entry(name: str, tensor: Tensor) -> TensorEntry:
    """The entry of a parameter ``name`` holding ``tensor``."""
    return TensorEntry(name, dtype_name(tensor.dtype), tuple(tensor.shape))


def converted(
    graph: ForwardGraph, inputs: Sequence[Tensor], params: Sequence[Tensor]
) -> Callable[..., Sequence[Tensor]]:
    """``graph`` converted for ``inputs``, its literals that follow the sizes of dynamic axes made expressions of
    those sizes (``ForwardGraph.eager_module``), so that the export can keep the axes dynamic."""
    return graph.specialised(inputs, params, "package", graph.eager_module, dynamic=True)


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
