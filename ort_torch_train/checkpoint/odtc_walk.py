"""Walk and verify an ORT "ODTC" checkpoint buffer without torch (see ``odtc`` for the format).

The one parser of the untrusted file: the structure is walked and verified through ``fbs_reader``
(no tensor memory allocated) into a ``CheckpointLayout``; ``TensorData`` then checks each tensor's
size against its dims and element type and hands out its bytes (a view of the buffer, or read from
the external data file). ``odtc_read`` makes torch tensors of those bytes; ``summary`` describes the
checkpoint without them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ort_torch_train.elem_types import ElemDtype, elem_dtype, elem_type_name
from ort_torch_train.graph.fbs_reader import FlatBuffer, Table

from ..errors import CheckpointError, UnsupportedTypeError

FILE_IDENTIFIER = b"ODTC"
CHECKPOINT_VERSION = 2

# Reads (offset, byte count, tensor description) from the external data file.
ExternalReader = Callable[[int, int, str], bytes | bytearray]


@dataclass
class TensorEntry:
    """A tensor as found in the buffer, before any data is copied."""

    where: str
    name: str
    data_type: int
    dims: list[int]
    raw_data: tuple[int, int] | None  # (start, length) in the buffer
    external_offset: int


@dataclass
class GroupEntry:
    """An optimizer group as found in the buffer, before any data is copied."""

    name: str
    step: int
    initial_learning_rate: float
    momentums: dict[str, list[TensorEntry]]  # param name -> its moments, in file order


@dataclass
class CheckpointLayout:
    """Everything a verified checkpoint buffer holds, its tensors as entries (no data read yet)."""

    trainable: list[TensorEntry]  # requires_grad_params, file order
    frozen: list[TensorEntry]  # frozen_params, file order
    is_nominal: bool
    has_external_data: bool
    groups: list[GroupEntry]
    properties: dict[str, int | float | str]  # int64 / float32 / str


def invalid(message: str) -> CheckpointError:
    """A CheckpointError with ORT's text for an invalid checkpoint first."""
    return CheckpointError(f"Checkpoint is invalid. {message}")


def _tensor_entry(table: Table) -> TensorEntry:
    name = table.string(0, "name")
    table.string(1, "doc_string")
    dims = table.int64s(2, "dims")
    data_type = int(table.scalar(3, "<i", 0, "data_type"))
    raw_data = table.vector(4, 1, "raw_data")
    table.strings(5, "string_data")
    external_offset = int(table.scalar(6, "<q", -1, "external_data_offset"))
    if name is None:
        raise invalid(f"{table.where} has no name.")
    if dims is None:
        raise invalid(f"{table.where} ({name!r}) has no dims.")
    table.buf.claim(dims, f"{table.where}.dims", "the dims vector")
    return TensorEntry(table.where, name, data_type, dims, raw_data, external_offset)


def _tensor_entries(tables: list[Table] | None, where: str) -> list[TensorEntry]:
    if tables is None:
        raise invalid(f"{where} is missing (Expected: a vector of tensors. Actual: nullptr).")
    entries, seen = [], set()
    for table in tables:  # names checked as they come: a table referenced twice fails at once
        table.buf.charge(16, table.where)  # a tensor table takes at least that many uncounted bytes
        entry = _tensor_entry(table)
        if entry.name in seen:
            raise invalid(f"{where} holds the name {entry.name!r} more than once.")
        seen.add(entry.name)
        entries.append(entry)
    return entries


def _check_unique(names: list[str], where: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise invalid(f"{where} holds the name {name!r} more than once.")
        seen.add(name)


class TensorData:
    """Checks each tensor's size before handing out its bytes from the buffer or the external file."""

    def __init__(self, buf: FlatBuffer, read_external: ExternalReader | None) -> None:
        self.buf = buf
        self.read_external = read_external  # None: the checkpoint declares no external data
        self.inline_bytes = 0

    def dtype(self, entry: TensorEntry) -> ElemDtype:
        """The entry's dtype; an invalid-checkpoint error for an element type no tensor here can have."""
        try:
            return elem_dtype(entry.data_type, entry.name)
        except UnsupportedTypeError as error:
            raise invalid(f"{entry.where}: {error}") from None

    def read(self, entry: TensorEntry) -> bytes | bytearray | memoryview:
        """The entry's little-endian bytes, after checking they are exactly what its dims and dtype need."""
        itemsize = self.dtype(entry).itemsize
        label = f"{entry.where} ({entry.name!r})"
        if any(dim < 0 for dim in entry.dims):
            raise invalid(f"{label} has a negative dimension in dims {entry.dims}.")
        # a zero dim empties the tensor, but torch still needs the other dims' strides to fit in int64
        if math.prod(max(dim, 1) for dim in entry.dims) * itemsize >= 2**63:
            raise invalid(f"{label} has dims {entry.dims} whose size overflows int64.")
        nbytes = math.prod(entry.dims) * itemsize
        if entry.external_offset >= 0:
            return self._external(entry, label, nbytes)
        if entry.raw_data is not None:
            return self._inline(entry, entry.raw_data, label, nbytes)
        raise invalid(f"{label} has neither raw_data nor an external_data_offset.")

    def _inline(self, entry: TensorEntry, raw_data: tuple[int, int], label: str, nbytes: int) -> memoryview:
        start, length = raw_data
        if length != nbytes:
            raise invalid(
                f"{label} holds {length} bytes of raw_data, but dims {entry.dims} of "
                f"{elem_type_name(entry.data_type)} need {nbytes}."
            )
        self.inline_bytes += length
        if self.inline_bytes > self.buf.size:
            raise invalid("tensors share raw_data: their total size exceeds the buffer size.")
        return self.buf.data[start : start + length]

    def _external(self, entry: TensorEntry, label: str, nbytes: int) -> bytes | bytearray:
        if self.read_external is None:
            raise invalid(
                f"{label} has an external_data_offset, but the module state does not declare "
                "external data (has_external_data is false)."
            )
        return self.read_external(entry.external_offset, nbytes, label)


def _group_entries(tables: list[Table] | None) -> list[GroupEntry]:
    groups: list[GroupEntry] = []
    for table in tables or []:
        name = table.string(0, "group_name")
        if name is not None and any(group.name == name for group in groups):
            raise invalid(f"optimizer_groups holds the name {name!r} more than once.")
        step = int(table.scalar(1, "<q", 0, "step"))
        learning_rate = float(table.scalar(2, "<f", 0.0, "initial_learning_rate"))
        states = table.tables(3, "optimizer_states")
        if name is None:
            raise invalid(f"{table.where} has no group_name.")
        if states is None:
            raise invalid(f"{table.where} ({name!r}) has no optimizer_states.")
        momentums: dict[str, list[TensorEntry]] = {}
        for state in states:
            param_name = state.string(0, "param_name")
            if param_name is None:
                raise invalid(f"{state.where} has no param_name.")
            if param_name in momentums:
                raise invalid(f"{table.where} ({name!r}) lists parameter {param_name!r} twice.")
            momentums[param_name] = _tensor_entries(state.tables(1, "momentums"), f"{state.where}.momentums")
        groups.append(GroupEntry(name, step, learning_rate, momentums))
    _check_unique([group.name for group in groups], "optimizer_groups")
    return groups


def _properties(table: Table | None) -> dict[str, int | float | str]:
    if table is None:
        return {}
    found: list[tuple[str, int | float | str]] = []
    kinds = ((0, "ints", "<q", int), (1, "floats", "<f", float))
    for slot, field_name, fmt, kind in kinds:
        for item in table.tables(slot, field_name) or []:
            name = item.string(0, "name")
            if name is None:
                raise invalid(f"{item.where} has no name.")
            found.append((name, kind(item.scalar(1, fmt, 0, "value"))))
    for item in table.tables(2, "strings") or []:
        name, value = item.string(0, "name"), item.string(1, "value")
        if name is None or value is None:
            raise invalid(f"{item.where} has no {'name' if name is None else 'value'}.")
        found.append((name, value))
    _check_unique([name for name, _ in found], "property_bag")
    return dict(found)


def walk_checkpoint(buf: FlatBuffer) -> CheckpointLayout:
    """Verify an ODTC buffer's structure and list what it holds (a version-2 checkpoint only)."""
    root = buf.root(FILE_IDENTIFIER)
    version = int(root.scalar(0, "<i", 0, "version"))
    module = root.table(1, "module_state")
    groups = _group_entries(root.tables(2, "optimizer_groups"))
    property_table = root.table(3, "property_bag")
    trainable = frozen = []
    is_nominal = has_external = False
    if module is not None:
        trainable = _tensor_entries(module.tables(0, "requires_grad_params"), "module_state.requires_grad_params")
        frozen = _tensor_entries(module.tables(1, "frozen_params"), "module_state.frozen_params")
        is_nominal = bool(module.scalar(2, "<B", 0, "is_nominal_state"))
        has_external = bool(module.scalar(3, "<B", 0, "has_external_data"))
    properties = _properties(property_table)
    if version != CHECKPOINT_VERSION:
        raise invalid(
            f"Checkpoint version {version} is not supported (this reader supports version {CHECKPOINT_VERSION} only)."
        )
    _check_unique([entry.name for entry in trainable + frozen], "module_state")
    return CheckpointLayout(trainable, frozen, is_nominal, has_external, groups, properties)
