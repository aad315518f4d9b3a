"""What an ORT checkpoint holds, described without torch: parameter names, dtypes, shapes and trainability,
the optimizer group, the properties (what ``ort-torch-train inspect`` shows).

The file is read through the same walk as ``read_checkpoint`` (``odtc_walk``), with every check the
loading of a ``TrainingState`` makes: tensor sizes, at most one optimizer group, floating-point
trainable parameters, moments shaped and typed like their parameter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ort_torch_train.elem_types import FLOATING_ELEM_TYPES
from ort_torch_train.graph.fbs_reader import FlatBuffer

from ..errors import CheckpointError
from .odtc_walk import CheckpointLayout, ExternalReader, TensorData, TensorEntry, walk_checkpoint
from .source import read_source


@dataclass(frozen=True)
class ParameterSummary:
    """One parameter: its dtype name (float32, ...), dims (None in a nominal checkpoint) and trainability."""

    name: str
    dtype: str
    shape: list[int] | None
    trainable: bool


@dataclass(frozen=True)
class GroupSummary:
    """The optimizer group: name, step count, initial learning rate, and each parameter's moment names."""

    name: str
    step: int
    initial_learning_rate: float
    momentums: dict[str, list[str]]  # param name -> its moments' names, file order


@dataclass(frozen=True)
class CheckpointSummary:
    """A checkpoint's contents without tensor values; parameters trainable first, each kind in file order."""

    parameters: list[ParameterSummary]
    is_nominal: bool
    has_external_data: bool
    optimizer: GroupSummary | None
    properties: dict[str, int | float | str]


def summarize_checkpoint(source: str | os.PathLike | bytes | bytearray | memoryview) -> CheckpointSummary:
    """Verify an ORT checkpoint (a path or its bytes) as loading it would, and describe it.

    Raises what ``read_checkpoint`` and ``TrainingState.load`` raise for the same file.
    """
    return read_source(source, _summarize)


def _summarize(data: bytes | bytearray | memoryview, read_external: ExternalReader) -> CheckpointSummary:
    buf = FlatBuffer(data)
    try:
        layout = walk_checkpoint(buf)
        tensors = TensorData(buf, read_external if layout.has_external_data else None)
        for entry in layout.trainable + layout.frozen:
            if layout.is_nominal:
                tensors.dtype(entry)
            else:
                tensors.read(entry)
        for group in layout.groups:
            for entries in group.momentums.values():
                for entry in entries:
                    tensors.read(entry)
        return _describe(layout, tensors)
    finally:
        buf.release()


def _describe(layout: CheckpointLayout, tensors: TensorData) -> CheckpointSummary:
    def parameter(entry: TensorEntry, trainable: bool) -> ParameterSummary:
        dtype = tensors.dtype(entry).name
        if trainable and entry.data_type not in FLOATING_ELEM_TYPES:
            raise CheckpointError(
                f"trainable parameter {entry.name!r} has dtype {dtype}; "
                "only floating-point parameters can require gradients"
            )
        return ParameterSummary(entry.name, dtype, None if layout.is_nominal else list(entry.dims), trainable)

    parameters = [parameter(entry, True) for entry in layout.trainable]
    parameters += [parameter(entry, False) for entry in layout.frozen]
    if len(layout.groups) > 1:
        raise CheckpointError(
            f"the checkpoint holds {len(layout.groups)} optimizer groups "
            f"{[group.name for group in layout.groups]}; only one group is supported (as in ORT)"
        )
    optimizer = None
    if layout.groups:
        group = layout.groups[0]
        _check_moments(group.name, group.momentums, layout, tensors)
        moments = {param: [entry.name for entry in entries] for param, entries in group.momentums.items()}
        optimizer = GroupSummary(group.name, group.step, group.initial_learning_rate, moments)
    return CheckpointSummary(parameters, layout.is_nominal, layout.has_external_data, optimizer, layout.properties)


def _check_moments(
    group_name: str, momentums: dict[str, list[TensorEntry]], layout: CheckpointLayout, tensors: TensorData
) -> None:
    """Moments of no parameter, or (unless nominal) shaped or typed unlike their parameter, are refused."""
    params = {entry.name: entry for entry in layout.trainable + layout.frozen}
    for name, moments in momentums.items():
        if name not in params:
            raise CheckpointError(
                f"optimizer group {group_name!r} holds moments for {name!r}, which is not a parameter"
            )
        param = params[name]
        for moment in moments:
            if not layout.is_nominal and (moment.dims != param.dims or moment.data_type != param.data_type):
                raise CheckpointError(
                    f"optimizer moment {moment.name!r} of {name!r} is "
                    f"{tensors.dtype(moment).name}{_shape_text(moment.dims)}, but the "
                    f"parameter is {tensors.dtype(param).name}{_shape_text(param.dims)}"
                )


def _shape_text(dims: list[int]) -> str:
    return "{" + ",".join(str(dim) for dim in dims) + "}"
