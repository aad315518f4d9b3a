"""Decode an ORT "ODTC" checkpoint buffer into a CheckpointRecord of torch tensors (see ``odtc`` for the format).

The buffer is walked and verified by ``odtc_walk`` (no tensor memory is allocated); only then is every
tensor's data, checked against its dims and element type there, copied into a torch tensor.
"""

from __future__ import annotations

import torch

from ort_torch_train.dtypes import torch_dtype
from ort_torch_train.graph.fbs_reader import FlatBuffer

from .odtc_walk import ExternalReader, GroupEntry, TensorData, TensorEntry, walk_checkpoint
from .records import CheckpointRecord, OptimizerGroupRecord
from .tensor_bytes import tensor_from_bytes


class _TensorMaker:
    """Torch tensors of checked tensor entries: empty ones of their dtype (nominal), or copies of their data."""

    def __init__(self, data: TensorData) -> None:
        self.data = data

    def nominal(self, entry: TensorEntry) -> torch.Tensor:
        self.data.dtype(entry)  # an element type without a dtype is refused here too
        return torch.empty(0, dtype=torch_dtype(entry.data_type, entry.name))

    def full(self, entry: TensorEntry) -> torch.Tensor:
        data = self.data.read(entry)
        return tensor_from_bytes(data, torch_dtype(entry.data_type, entry.name), entry.dims)


def _optimizer_group(group: GroupEntry, maker: _TensorMaker) -> OptimizerGroupRecord:
    momentums = {
        param: {entry.name: maker.full(entry) for entry in entries} for param, entries in group.momentums.items()
    }
    return OptimizerGroupRecord(group.name, group.step, group.initial_learning_rate, momentums)


def decode_checkpoint(data: bytes | bytearray | memoryview, read_external: ExternalReader) -> CheckpointRecord:
    """Verify and decode an ODTC buffer; read_external is called for tensor data that lies in
    the external data file."""
    buf = FlatBuffer(data)
    try:
        layout = walk_checkpoint(buf)
        maker = _TensorMaker(TensorData(buf, read_external if layout.has_external_data else None))
        make = maker.nominal if layout.is_nominal else maker.full
        return CheckpointRecord(
            trainable={entry.name: make(entry) for entry in layout.trainable},
            frozen={entry.name: make(entry) for entry in layout.frozen},
            is_nominal=layout.is_nominal,
            optimizer_groups=[_optimizer_group(group, maker) for group in layout.groups],
            properties=layout.properties,
            has_external_data=layout.has_external_data,
        )
    finally:
        buf.release()
