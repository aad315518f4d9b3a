"""The inference exports a package prepares for the runtime with no Python (its ``ExportModelForInferencing``).

For each set of output names the package prepares, ``export_K.onnx``: the inference model ``export/inference.py``
writes for that set, each parameter it bakes in held as an initializer's raw data, with the byte range of each
parameter's data in the file (``ParameterRange``). The runtime writes an export by copying that file with the current
parameter values in those ranges; it reads no ONNX. Beside it, the package compiles the inference graph (the
program folder ``export_K``), so the runtime also runs the models it exported (OrtApi's ``CreateSession`` and
``Run``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
import torch
from torch import Tensor

from ort_torch_train.dtypes import dtype_name
from ort_torch_train.errors import PackageError
from ort_torch_train.export.inference import inference_model
from ort_torch_train.export.outputs import exportable_output_names
from ort_torch_train.fileio import atomic_write_bytes, path_inside

MODEL_LIMIT = 2**31 - 1  # bytes: one protobuf message, as the runtime reads it (no external data)
SENTINEL_SEEDS = 8  # tries at sentinel values found exactly once in the serialised model


@dataclass(frozen=True)
class ParameterRange:
    """Where one baked parameter's data lies in a prepared export model: ``length`` bytes from ``offset``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int


@dataclass(frozen=True)
class ExportTemplate:
    """One prepared export: its outputs, model file, user inputs (names, in the model's order) and parameters (in
    the model's order, which the compiled inference program takes after the inputs)."""

    outputs: tuple[str, ...]
    model_file: str
    inputs: tuple[str, ...]
    parameters: tuple[ParameterRange, ...]


def output_sets(
    eval_model: onnx.ModelProto, param_names: Sequence[str], asked: Sequence[Sequence[str]]
) -> list[tuple[str, ...]]:
    """The output sets to prepare: the eval model's outputs before its loss (``exportable_output_names`` less the
    eval graph's outputs), where it has any, then each set ``asked``, each once."""
    losses = {value.name for value in eval_model.graph.output}
    model_outputs = tuple(name for name in exportable_output_names(eval_model, param_names) if name not in losses)
    sets: list[tuple[str, ...]] = [model_outputs] if model_outputs else []
    for names in asked:
        chosen = tuple(names)
        if not chosen or not all(isinstance(name, str) and name for name in chosen):
            raise ValueError(f"export_outputs: expected non-empty lists of output names, got {list(names)!r}")
        if chosen not in sets:
            sets.append(chosen)
    return sets


def write_template(
    eval_model: onnx.ModelProto,
    params: Mapping[str, Tensor],
    outputs: Sequence[str],
    folder: str | os.PathLike,
    model_file: str,
) -> ExportTemplate:
    """Write the inference model of ``eval_model`` for ``outputs`` with ``params`` baked in to ``folder/model_file``,
    atomically; return where its parameters lie. PackageError where the model passes 2 GiB."""
    baked = _baked_names(eval_model, params, outputs)
    for seed in range(SENTINEL_SEEDS):
        sentinels = {name: _sentinel(params[name], seed, index) for index, name in enumerate(baked)}
        serialised = inference_model(eval_model, {**params, **sentinels}, outputs).SerializeToString()
        ranges = _ranges(serialised, baked, sentinels, params)
        if ranges is not None:
            break
    else:
        raise PackageError(f"package: cannot locate the parameters of the export of {list(outputs)} in its model")
    if len(serialised) > MODEL_LIMIT:
        raise PackageError(f"package: the export of {list(outputs)} is over 2 GiB; the runtime cannot prepare it")
    data = bytearray(serialised)
    for entry in ranges:
        data[entry.offset : entry.offset + entry.length] = _bytes(params[entry.name])
    model = onnx.ModelProto.FromString(bytes(data))
    held = {init.name: init.raw_data for init in model.graph.initializer}
    if any(held.get(entry.name) != _bytes(params[entry.name]) for entry in ranges):
        raise PackageError(f"package: the export of {list(outputs)} does not hold its parameters where located")
    atomic_write_bytes(path_inside(folder, model_file, "package export"), bytes(data))
    inputs = tuple(value.name for value in model.graph.input)
    return ExportTemplate(tuple(outputs), model_file, inputs, ranges)


def _baked_names(eval_model: onnx.ModelProto, params: Mapping[str, Tensor], outputs: Sequence[str]) -> list[str]:
    """The parameters the inference model for ``outputs`` bakes in, in its order."""
    model = inference_model(eval_model, {name: torch.zeros(0) for name in params}, outputs)
    return [init.name for init in model.graph.initializer if init.name in params]


def _sentinel(tensor: Tensor, seed: int, index: int) -> Tensor:
    """A tensor like ``tensor`` of random bytes (``seed``, ``index``): found once in a serialised model."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    length = tensor.numel() * tensor.element_size()
    raw = torch.randint(0, 256, (length,), dtype=torch.uint8, generator=generator)
    return raw.view(tensor.dtype).reshape(tensor.shape)


def _bytes(tensor: Tensor) -> bytes:
    value = tensor.detach().cpu().contiguous()
    return value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""


def _ranges(
    serialised: bytes, baked: Sequence[str], sentinels: Mapping[str, Tensor], params: Mapping[str, Tensor]
) -> tuple[ParameterRange, ...] | None:
    """Each baked parameter's range in ``serialised``, found by its sentinel; None where one is not found once."""
    ranges = []
    for name in baked:
        pattern = _bytes(sentinels[name])
        offset = serialised.find(pattern) if pattern else 0
        if offset < 0 or (pattern and serialised.find(pattern, offset + 1) >= 0):
            return None
        tensor = params[name]
        ranges.append(ParameterRange(name, dtype_name(tensor.dtype), tuple(tensor.shape), offset, len(pattern)))
    return tuple(ranges)
