"""Encode a CheckpointRecord as an ORT "ODTC" FlatBuffer, building it the way ORT 1.19 does.

The calls into the builder follow ORT's ``save::FromCheckpointState`` (training_api/checkpoint.cc)
and ``fbs::utils::SaveOrtTensorOrtFormat`` one for one: the same objects created in the same order
and the same fields added in the same order, so that the bytes equal ORT's for the same content.
That save writes tensors sorted by name. The artifact layout follows ``save::FromTensorProtos``
instead (what ``generate_artifacts`` writes): tensors in the record's order, no optimizer groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import torch

from ort_torch_train.dtypes import onnx_elem_type

from ..errors import CheckpointError
from .odtc_walk import CHECKPOINT_VERSION, FILE_IDENTIFIER
from .records import CheckpointRecord
from .tensor_bytes import tensor_to_bytes

INT64_LIMITS = (-(2**63), 2**63 - 1)
_EIGHT_BYTE_ALIGNED = (torch.int64, torch.float64)  # ORT aligns only INT64 and DOUBLE to 8


@dataclass
class ExternalDataPlan:
    """Where each tensor's data goes in the external data file (ORT's aligned layout)."""

    momentums: bool = False  # optimizer moments too (ORT itself keeps them inline)
    min_bytes: int = 0  # smaller tensors stay inline (64 in ORT's artifact layout)
    chunks: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (offset, tensor)
    size: int = 0

    def place(self, tensor: torch.Tensor) -> int:
        """Reserve room for tensor: aligned to 8 for int64/float64, else to 4. Returns the offset."""
        alignment = 8 if tensor.dtype in _EIGHT_BYTE_ALIGNED else 4
        offset = -(-self.size // alignment) * alignment
        self.chunks.append((offset, tensor))
        self.size = offset + tensor.numel() * tensor.dtype.itemsize
        return offset


def iter_record_tensors(record: CheckpointRecord, include_optimizer: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(description, tensor) for every tensor of the record, in the order they are written."""
    for kind, tensors in (("trainable", record.trainable), ("frozen", record.frozen)):
        for name in sorted(tensors):
            yield f"{kind} parameter {name!r}", tensors[name]
    if include_optimizer:
        for group in sorted(record.optimizer_groups, key=lambda g: g.name):
            for param in sorted(group.momentums):
                for moment, tensor in sorted(group.momentums[param].items()):
                    yield f"optimizer group {group.name!r} {param!r} {moment!r}", tensor


def data_bytes(record: CheckpointRecord, include_optimizer: bool = True) -> int:
    """Total bytes of tensor data in the record (parameters, and moments unless excluded)."""
    return sum(t.numel() * t.dtype.itemsize for _, t in iter_record_tensors(record, include_optimizer))


def check_record(record: CheckpointRecord, artifact: bool = False) -> None:
    """Fail with a clear message when the record cannot be written as an ORT checkpoint."""
    if artifact and (record.optimizer_groups or record.properties):
        raise CheckpointError(
            "an artifact checkpoint (generate_artifacts' layout) holds "
            "parameters only: this record has optimizer groups or properties"
        )
    overlap = set(record.trainable) & set(record.frozen)
    if overlap:
        raise CheckpointError(f"parameters {sorted(overlap)} are both trainable and frozen")
    for what, tensor in iter_record_tensors(record):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
        try:
            onnx_elem_type(tensor.dtype, what)
        except ValueError as error:
            raise CheckpointError(str(error)) from None
    names = [group.name for group in record.optimizer_groups]
    if len(set(names)) != len(names):
        raise CheckpointError(f"optimizer group names repeat: {names}")
    for name, value in record.properties.items():
        if not isinstance(name, str):
            raise TypeError(f"property names must be str, got {type(name).__name__} {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError(f"property {name!r} must be int, float or str, got {type(value).__name__}")
        if isinstance(value, int) and not INT64_LIMITS[0] <= value <= INT64_LIMITS[1]:
            raise CheckpointError(f"property {name!r} = {value} does not fit in int64")


class _Encoder:
    """One checkpoint being built; mirrors ORT's save::From* functions."""

    def __init__(self, record: CheckpointRecord, external: ExternalDataPlan | None, artifact: bool) -> None:
        self.record = record
        self.external = external
        self.artifact = artifact
        param_bytes = data_bytes(record, include_optimizer=False)
        moment_bytes = data_bytes(record) - param_bytes
        size_hint = (
            1024
            + 256 * sum(1 for _ in iter_record_tensors(record))
            + (0 if external else param_bytes)
            + (0 if external and external.momentums else moment_bytes)
        )
        self.builder = flatbuffers.Builder(min(size_hint, flatbuffers.Builder.MAX_BUFFER_SIZE))

    def tensor(self, name: str, tensor: torch.Tensor, external: bool) -> int:
        """SaveOrtTensorOrtFormat: name, dims, raw data, then the Tensor table."""
        b = self.builder
        name_offset = b.CreateString(name)
        dims = [] if self.record.is_nominal and tensor.numel() == 0 else list(tensor.shape)
        # C++'s builder skips alignment for an empty vector (PreAlign returns when len == 0)
        b.StartVector(8, len(dims), 8 if dims else 4)
        for dim in reversed(dims):
            b.PrependInt64(dim)
        dims_offset = b.EndVector()
        plan = self.external if external else None
        if plan is not None and tensor.numel() * tensor.dtype.itemsize < plan.min_bytes:
            plan = None  # small enough to stay inline
        raw_offset = None if plan is not None else b.CreateByteVector(tensor_to_bytes(tensor))
        b.StartObject(7)
        b.PrependUOffsetTRelativeSlot(0, name_offset, 0)
        b.PrependUOffsetTRelativeSlot(2, dims_offset, 0)
        b.PrependInt32Slot(3, onnx_elem_type(tensor.dtype, name), 0)
        if plan is not None:
            b.PrependInt64Slot(6, plan.place(tensor), -1)
        else:
            b.PrependUOffsetTRelativeSlot(4, raw_offset, 0)
        return b.EndObject()

    def tensors(self, named: dict[str, torch.Tensor], external: bool) -> list[int]:
        names = list(named) if self.artifact else sorted(named)
        return [self.tensor(name, named[name], external) for name in names]

    def offsets_vector(self, offsets: list[int]) -> int:
        b = self.builder
        b.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            b.PrependUOffsetTRelative(offset)
        return b.EndVector()

    def module_state(self) -> int | None:
        record, b = self.record, self.builder
        if not record.trainable and not record.frozen and not self.artifact:
            return None
        external = self.external is not None
        trainable_tensors = self.tensors(record.trainable, external)
        frozen_tensors = self.tensors(record.frozen, external)
        trainable = self.offsets_vector(trainable_tensors)
        frozen = self.offsets_vector(frozen_tensors)
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, trainable, 0)
        b.PrependUOffsetTRelativeSlot(1, frozen, 0)
        b.PrependBoolSlot(2, record.is_nominal, False)
        b.PrependBoolSlot(3, self.external is not None, False)
        return b.EndObject()

    def optimizer_groups(self) -> list[int]:
        b, groups = self.builder, []
        external = self.external is not None and self.external.momentums
        for group in sorted(self.record.optimizer_groups, key=lambda g: g.name):
            states = []
            for param in sorted(group.momentums):
                tensors = self.tensors(group.momentums[param], external)
                param_name = b.CreateString(param)
                momentums = self.offsets_vector(tensors)
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, param_name, 0)
                b.PrependUOffsetTRelativeSlot(1, momentums, 0)
                states.append(b.EndObject())
            group_name = b.CreateString(group.name)
            states_vector = self.offsets_vector(states)
            b.StartObject(4)
            b.PrependUOffsetTRelativeSlot(0, group_name, 0)
            b.PrependFloat32Slot(2, float(np.float32(group.initial_learning_rate)), 0.0)
            b.PrependInt64Slot(1, int(group.step), 0)
            b.PrependUOffsetTRelativeSlot(3, states_vector, 0)
            groups.append(b.EndObject())
        return groups

    def property_bag(self) -> int | None:
        b, properties = self.builder, self.record.properties
        if not properties:
            return None
        ints, floats, strings = [], [], []
        for name in sorted(properties):
            value = properties[name]
            name_offset = b.CreateString(name)
            if isinstance(value, str):
                value_offset = b.CreateString(value)
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, name_offset, 0)
                b.PrependUOffsetTRelativeSlot(1, value_offset, 0)
                strings.append(b.EndObject())
            elif isinstance(value, int):
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, name_offset, 0)
                b.PrependInt64Slot(1, value, 0)
                ints.append(b.EndObject())
            else:
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, name_offset, 0)
                b.PrependFloat32Slot(1, float(np.float32(value)), 0.0)
                floats.append(b.EndObject())
        vectors = [self.offsets_vector(items) for items in (ints, floats, strings)]
        b.StartObject(3)
        for slot, vector in enumerate(vectors):
            b.PrependUOffsetTRelativeSlot(slot, vector, 0)
        return b.EndObject()

    def checkpoint(self) -> memoryview:
        b = self.builder
        module_state = self.module_state()
        groups = self.optimizer_groups()
        property_bag = self.property_bag()
        groups_vector = None if self.artifact else self.offsets_vector(groups)
        b.StartObject(4)
        b.PrependInt32Slot(0, CHECKPOINT_VERSION, 0)
        if module_state is not None:
            b.PrependUOffsetTRelativeSlot(1, module_state, 0)
        if groups_vector is not None:
            b.PrependUOffsetTRelativeSlot(2, groups_vector, 0)
        if property_bag is not None:
            b.PrependUOffsetTRelativeSlot(3, property_bag, 0)
        b.Finish(b.EndObject(), file_identifier=FILE_IDENTIFIER)
        return memoryview(b.Bytes)[b.Head() :]  # the finished buffer, without copying it


def encode_checkpoint(
    record: CheckpointRecord, external: ExternalDataPlan | None = None, artifact: bool = False
) -> memoryview:
    """The ODTC bytes for record; with a plan, tensor data goes to the plan's offsets instead.
    artifact: lay it out like generate_artifacts (record order; no optimizer state, properties)."""
    check_record(record, artifact)
    try:
        return _Encoder(record, external, artifact).checkpoint()
    except flatbuffers.builder.BuilderSizeError as error:
        raise CheckpointError(
            f"checkpoint too large for one FlatBuffer (2 GiB): {error}; "
            "write it to a file so that tensor data goes to the external data file"
        ) from None
