"""``native_steps.txt``: a package described for the runtime with no Python (``native/packaged/``), one record a line.

The runtime reads no JSON and no ONNX: this file gives it, in words split by single spaces, the torch and the CPU
architecture the package was built for, the parameters (trainable, then frozen, in the programs' order; then the training graph's order,
the flat buffer's), each program's file, user inputs
(dtype, rank, sizes; -1 for a dynamic axis) and outputs, the eval step's parameters, and the optimizer's algorithm
(its program takes the trainable parameters, gradients and each moment as one flat buffer each, in the trainable
parameters' order),
moments and hyperparameters (as ``float.hex``, exact), so that it computes each step's scalars as the Python engine
does; the sha1 of each artifact file the package was built from (``artifact``), and each prepared inference export
(``exports.py``): its model file and program, outputs, inputs and parameters' byte ranges. The last line is ``end``. Names holding whitespace cannot be written and are refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from ort_torch_train.errors import PackageError
from ort_torch_train.fileio import atomic_write_bytes, path_inside
from ort_torch_train.optim.algorithm import Hyperparameters
from ort_torch_train.training.package.exports import ExportTemplate
from ort_torch_train.training.package.manifest import Manifest, Program, TensorEntry

FORMAT = "ort-torch-train-native/3"  # /2: the programs update their state in place; /3: a flat optimizer program
DESCRIPTION = "native_steps.txt"


def _word(name: str, what: str) -> str:
    if not name or any(character.isspace() for character in name):
        raise PackageError(f"package: {what} {name!r} holds whitespace; the native description cannot name it")
    return name


def _entry(entry: TensorEntry, what: str) -> str:
    sizes = ["-1" if size is None else str(size) for size in entry.shape]
    return " ".join([_word(entry.name, what), entry.dtype, str(len(entry.shape)), *sizes])


def _program(role: str, program: Program) -> list[str]:
    lines = [f"program {role} {_word(program.file, 'program file')}"]
    lines += [f"input {role} {_entry(entry, 'input')}" for entry in program.inputs]
    lines += [f"output {role} {_word(name, 'output')}" for name in program.outputs]
    return lines


Export = tuple[ExportTemplate, Program]


def _export(index: int, template: ExportTemplate, program: Program) -> list[str]:
    """An export's lines: its files, its program's inputs, outputs, and its parameters with their byte ranges."""
    lines = [f"export {index} {_word(template.model_file, 'export file')} {_word(program.file, 'program file')}"]
    lines += [f"export_input {index} {_entry(entry, 'input')}" for entry in program.inputs]
    lines += [f"export_output {index} {_word(name, 'output')}" for name in template.outputs]
    for entry in template.parameters:
        described = _entry(TensorEntry(entry.name, entry.dtype, entry.shape), "parameter")
        lines.append(f"export_parameter {index} {entry.offset} {entry.length} {described}")
    return lines


def describe(
    manifest: Manifest,
    graph_order: Sequence[str],
    hyperparameters: Hyperparameters | None,
    exports: Sequence[Export],
    digests: Mapping[str, str],
) -> bytes:
    """The description of the package ``manifest`` records; ``graph_order``: the training graph's parameters in
    its order (that of the parameters' flat buffer); ``hyperparameters``: its optimizer's (a dataclass);
    ``exports``: the prepared inference exports; ``digests``: model role -> sha1 of its artifact file."""
    lines = [FORMAT, f"torch {manifest.torch}", f"machine {_word(manifest.machine, 'machine')}"]
    lines += [f"parameter trainable {_entry(entry, 'parameter')}" for entry in manifest.trainable]
    lines += [f"parameter frozen {_entry(entry, 'parameter')}" for entry in manifest.frozen]
    lines += [f"parameter_order {_word(name, 'parameter')}" for name in graph_order]
    lines += _program("train", manifest.train)
    if manifest.eval is not None:
        lines += _program("eval", manifest.eval)
        lines += [f"eval_parameter {_word(name, 'parameter')}" for name in manifest.eval_parameters]
    if manifest.optimizer is not None and manifest.optimizer_algorithm is not None:
        lines += [f"program optimizer {_word(manifest.optimizer.file, 'program file')}"]
        lines += [f"algorithm {manifest.optimizer_algorithm}"]
        lines += [f"moment {_word(name, 'moment')}" for name in manifest.moments]
        lines += [f"hyperparameter {name} {value.hex()}" for name, value in _numbers(hyperparameters)]
    lines += [f"artifact {_word(role, 'role')} {digest}" for role, digest in digests.items()]
    for index, (template, program) in enumerate(exports):
        lines += _export(index, template, program)
    lines.append("end")
    return ("\n".join(lines) + "\n").encode()


def _numbers(hyperparameters: Hyperparameters | None) -> Sequence[tuple[str, float]]:
    if hyperparameters is None or not dataclasses.is_dataclass(hyperparameters):
        return []
    return [
        (field.name, float(getattr(hyperparameters, field.name)))
        for field in dataclasses.fields(hyperparameters)
        if field.name != "lr"
    ]


def write_description(
    folder: str | os.PathLike,
    manifest: Manifest,
    graph_order: Sequence[str],
    hyperparameters: Hyperparameters | None,
    exports: Sequence[Export],
    digests: Mapping[str, str],
) -> None:
    """Write ``native_steps.txt`` in the package ``folder``, atomically (``describe``)."""
    text = describe(manifest, graph_order, hyperparameters, exports, digests)
    atomic_write_bytes(path_inside(folder, DESCRIPTION, "package description"), text)
