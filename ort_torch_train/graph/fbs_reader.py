"""Bounds-checked reading of a FlatBuffers buffer: a verifier and a reader in one.

The ``flatbuffers`` Python package reads tables without any checks, so a corrupted file can make it
read out of range, loop over absurd vector lengths or allocate huge amounts of memory. Every access
here checks alignment and bounds against the buffer BEFORE reading, the way FlatBuffers' C++
``Verifier`` (which ORT runs before loading a checkpoint or an ORT-format model) does; a failure raises
the error of the buffer's ``Verification`` (for a checkpoint ``CheckpointError`` starting with ORT's text
"Checkpoint verification failed."), saying what was wrong and where.

A table referenced twice is refused; every string and vector is decoded once (later references
share the decoded object; a dims vector may belong to one tensor only), and
the bytes decoded in all are bounded by the buffer size, so a small file whose offsets point many
times at one shared vector cannot make the reader do more work or use more memory than its size.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError

VERIFICATION_FAILED = "Checkpoint verification failed."
MAX_TABLES = 1_000_000  # FlatBuffers' default Verifier limit on the number of tables
_UOFFSET = struct.Struct("<I")
_SOFFSET = struct.Struct("<i")
_VOFFSET = struct.Struct("<H")


@dataclass(frozen=True)
class Verification:
    """What a buffer should be, for its errors: ORT's verifier text, the error type and the content's name."""

    failed: str  # ORT's text when its verifier refuses the buffer
    error: Callable[[str], Exception]
    content: str  # what the file identifier says the buffer is

    def __call__(self, where: str, problem: str) -> Exception:
        """The error for ``problem`` found at ``where``: ORT's verifier text first."""
        return self.error(f"{self.failed} {where}: {problem}")


CHECKPOINT = Verification(VERIFICATION_FAILED, CheckpointError, "an ORT training checkpoint")


class FlatBuffer:
    """A read-only buffer whose reads are all alignment- and bounds-checked."""

    def __init__(self, data: bytes | bytearray | memoryview, verification: Verification = CHECKPOINT) -> None:
        self.verification = verification
        self.data = memoryview(data).cast("B")
        self.size = len(self.data)
        self.tables_seen = 0
        self.decoded: dict[tuple[str, int], object] = {}  # (kind, position) -> decoded value
        self.budget = self.size  # bytes of strings and vectors still allowed to be decoded

    def release(self) -> None:
        """Drop the decoded values, which hold tables that hold this buffer: without it, the buffer (a
        whole checkpoint file) lives on in that reference cycle until the garbage collector runs."""
        self.decoded.clear()

    def charge(self, nbytes: int, where: str) -> None:
        """Count nbytes against the decoding budget (the buffer size)."""
        self.budget -= nbytes
        if self.budget < 0:
            raise self.verification(
                where,
                f"the strings and vectors referenced add up to more than the {self.size} bytes "
                "of the buffer (overlapping or shared data)",
            )

    def claim(self, value: object, where: str, what: str) -> None:
        """Fail if the decoded object value (a shared vector) was already claimed by another field."""
        key = ("claimed", id(value))
        if key in self.decoded:
            raise self.verification(where, f"{what} is shared with {self.decoded[key]}; each needs its own")
        self.decoded[key] = where

    def memo(self, kind: str, pos: int, decode: Callable[[], Any]) -> Any:
        """decode() once per (kind, position)."""
        key = (kind, pos)
        if key not in self.decoded:
            self.decoded[key] = decode()
        return self.decoded[key]

    def check_range(self, pos: int, length: int, where: str, what: str) -> None:
        """Fail unless bytes [pos, pos + length) lie inside the buffer."""
        if pos < 0 or length < 0 or pos + length > self.size:
            raise self.verification(
                where, f"{what} at byte {pos} ({length} bytes) runs past the end of the {self.size}-byte buffer"
            )

    def check_alignment(self, pos: int, align: int, where: str, what: str) -> None:
        """Fail unless pos is a multiple of align, as FlatBuffers' Verifier requires."""
        if pos % align:
            raise self.verification(where, f"{what} at byte {pos} is not {align}-byte aligned")

    def unpack(self, fmt: struct.Struct, pos: int, where: str, what: str) -> int | float:
        """Read one aligned little-endian scalar at pos."""
        self.check_alignment(pos, fmt.size, where, what)
        self.check_range(pos, fmt.size, where, what)
        return fmt.unpack_from(self.data, pos)[0]

    def unpack_int(self, fmt: struct.Struct, pos: int, where: str, what: str) -> int:
        """``unpack`` for an integer format."""
        return int(self.unpack(fmt, pos, where, what))

    def follow(self, pos: int, where: str) -> int:
        """Target of the uoffset stored at pos (always forward, never 0, inside the buffer)."""
        offset = self.unpack_int(_UOFFSET, pos, where, "offset")
        if offset == 0:
            raise self.verification(where, f"offset at byte {pos} is 0")
        target = pos + offset
        self.check_range(target, 1, where, f"offset at byte {pos} (+{offset})")
        return target

    def root(self, identifier: bytes) -> Table:
        """The root table, after checking the size and the 4-byte file identifier."""
        if self.size < 8:
            raise self.verification(
                "header",
                f"the buffer holds {self.size} bytes, fewer than the 8 of a FlatBuffers "
                "header (root offset and file identifier)",
            )
        found = bytes(self.data[4:8])
        if found != identifier:
            raise self.verification(
                "header", f"file identifier is {found!r}, expected {identifier!r} (not {self.verification.content})"
            )
        return self.table(self.follow(0, "root"), "root")

    def table(self, pos: int, where: str) -> Table:
        """The table starting at pos, with its vtable checked; a table referenced twice is refused
        (FlatBuffers writers, ORT's included, never share tables)."""
        if ("table", pos) in self.decoded:
            raise self.verification(
                where, f"the table at byte {pos} is shared with {self.decoded[('table', pos)]}; each needs its own"
            )
        self.decoded[("table", pos)] = where
        return self._table(pos, where)

    def _table(self, pos: int, where: str) -> Table:
        self.tables_seen += 1
        if self.tables_seen > MAX_TABLES:
            raise self.verification(where, f"more than {MAX_TABLES} tables")
        vtable_delta = self.unpack_int(_SOFFSET, pos, where, "table")
        vtable = pos - vtable_delta
        vtable_size = self.unpack_int(_VOFFSET, vtable, where, "vtable")
        if vtable_size < 4 or vtable_size % 2:
            raise self.verification(where, f"vtable at byte {vtable} has invalid size {vtable_size}")
        self.check_range(vtable, vtable_size, where, "vtable")
        return Table(self, pos, vtable, vtable_size, where)

    def vector(self, pos: int, elem_size: int, where: str) -> tuple[int, int]:
        """(first element position, element count) of the vector whose length field is at pos."""
        count = self.unpack_int(_UOFFSET, pos, where, "vector length")
        self.check_range(pos + 4, count * elem_size, where, f"vector of {count} elements of {elem_size} bytes")
        return pos + 4, count

    def string(self, pos: int, where: str) -> str:
        """The zero-terminated UTF-8 string whose length field is at pos."""
        return self.memo("string", pos, lambda: self._string(pos, where))

    def string_bytes(self, pos: int, where: str) -> bytes:
        """The zero-terminated string whose length field is at pos, as bytes (any encoding)."""
        return self.memo("string_bytes", pos, lambda: self._string_bytes(pos, where))

    def _string_bytes(self, pos: int, where: str) -> bytes:
        start, length = self.vector(pos, 1, where)
        self.check_range(start + length, 1, where, "string terminator")
        self.charge(length, where)
        if self.data[start + length] != 0:
            raise self.verification(where, f"string at byte {pos} is not zero-terminated")
        return bytes(self.data[start : start + length])

    def _string(self, pos: int, where: str) -> str:
        try:
            return self._string_bytes(pos, where).decode("utf-8")
        except UnicodeDecodeError as error:
            raise self.verification(where, f"string at byte {pos} is not valid UTF-8 ({error})") from None


class Table:
    """One table of a FlatBuffer: fields by slot number (0 = the schema's first field)."""

    __slots__ = ("buf", "pos", "vtable", "vtable_size", "where")

    def __init__(self, buf: FlatBuffer, pos: int, vtable: int, vtable_size: int, where: str) -> None:
        self.buf, self.pos, self.vtable, self.vtable_size, self.where = (buf, pos, vtable, vtable_size, where)

    def _field_pos(self, slot: int) -> int | None:
        entry = 4 + 2 * slot
        if entry >= self.vtable_size:
            return None
        delta = _VOFFSET.unpack_from(self.buf.data, self.vtable + entry)[0]
        return self.pos + delta if delta else None

    def scalar(self, slot: int, fmt: str, default: int | float, name: str) -> int | float:
        """A scalar field (struct format fmt, e.g. '<q'), or its default when absent."""
        pos = self._field_pos(slot)
        if pos is None:
            return default
        return self.buf.unpack(struct.Struct(fmt), pos, f"{self.where}.{name}", "field")

    def _target(self, slot: int, name: str) -> tuple[int | None, str]:
        where = f"{self.where}.{name}"
        pos = self._field_pos(slot)
        return (None if pos is None else self.buf.follow(pos, where)), where

    def table(self, slot: int, name: str) -> Table | None:
        """A sub-table field, or None when absent."""
        target, where = self._target(slot, name)
        return None if target is None else self.buf.table(target, where)

    def string(self, slot: int, name: str) -> str | None:
        """A string field, or None when absent."""
        target, where = self._target(slot, name)
        return None if target is None else self.buf.string(target, where)

    def vector(self, slot: int, elem_size: int, name: str) -> tuple[int, int] | None:
        """(start, count) of a vector-of-scalars field, or None when absent."""
        target, where = self._target(slot, name)
        return None if target is None else self.buf.vector(target, elem_size, where)

    def _decoded_vector(
        self, slot: int, elem_size: int, name: str, kind: str, decode: Callable[[int, int, str], list]
    ) -> list | None:
        """decode(start, count, where) of a vector field, once per vector, charged to the budget."""
        target, where = self._target(slot, name)
        if target is None:
            return None

        def first_decode() -> list:
            start, count = self.buf.vector(target, elem_size, where)
            self.buf.charge(count * elem_size, where)
            return decode(start, count, where)

        return self.buf.memo(kind, target, first_decode)

    def int64s(self, slot: int, name: str) -> list[int] | None:
        """A [int64] field as a list, or None when absent."""
        return self._decoded_vector(
            slot,
            8,
            name,
            "int64s",
            lambda start, count, where: list(struct.unpack_from(f"<{count}q", self.buf.data, start)),
        )

    def float32s(self, slot: int, name: str) -> list[float] | None:
        """A [float] field as a list, or None when absent."""
        return self._decoded_vector(
            slot,
            4,
            name,
            "float32s",
            lambda start, count, where: list(struct.unpack_from(f"<{count}f", self.buf.data, start)),
        )

    def ubytes(self, slot: int, name: str) -> bytes | None:
        """A [ubyte] field (raw tensor data) as bytes, or None when absent."""
        target, where = self._target(slot, name)
        if target is None:
            return None

        def first_decode() -> bytes:
            start, count = self.buf.vector(target, 1, where)
            self.buf.charge(count, where)
            return bytes(self.buf.data[start : start + count])

        return self.buf.memo("ubytes", target, first_decode)

    def byte_string(self, slot: int, name: str) -> bytes | None:
        """A string field as bytes (not decoded as UTF-8), or None when absent."""
        target, where = self._target(slot, name)
        return None if target is None else self.buf.string_bytes(target, where)

    def byte_strings(self, slot: int, name: str) -> list[bytes] | None:
        """A vector-of-strings field as bytes, or None when absent."""
        return self._decoded_vector(
            slot,
            4,
            name,
            "byte_strings",
            lambda start, count, where: [
                self.buf.string_bytes(self.buf.follow(start + 4 * i, f"{where}[{i}]"), f"{where}[{i}]")
                for i in range(count)
            ],
        )

    def tables(self, slot: int, name: str) -> list[Table] | None:
        """A vector-of-tables field, or None when absent."""
        return self._decoded_vector(
            slot,
            4,
            name,
            "tables",
            lambda start, count, where: [
                self.buf.table(self.buf.follow(start + 4 * i, f"{where}[{i}]"), f"{where}[{i}]") for i in range(count)
            ],
        )

    def strings(self, slot: int, name: str) -> list[str] | None:
        """A vector-of-strings field, or None when absent."""
        return self._decoded_vector(
            slot,
            4,
            name,
            "strings",
            lambda start, count, where: [
                self.buf.string(self.buf.follow(start + 4 * i, f"{where}[{i}]"), f"{where}[{i}]") for i in range(count)
            ],
        )
