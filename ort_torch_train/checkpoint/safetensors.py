"""The safetensors file format, implemented directly (no dependency on the ``safetensors`` package).

Layout: an 8-byte little-endian header length N; N bytes of UTF-8 JSON mapping each tensor name to
``{"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}`` plus an optional
``"__metadata__": {str: str}``; then the data, tensors packed back to back, offsets relative to the
start of the data. The header is padded with spaces so that the data starts 8-byte aligned.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections import Counter
from pathlib import Path
from typing import BinaryIO

import torch

from ..errors import SafetensorsError
from ..fileio import atomic_write
from .tensor_bytes import tensor_from_bytes, tensor_to_bytes

MAX_HEADER_SIZE = 100_000_000  # the limit the reference implementation enforces
METADATA_KEY = "__metadata__"

DTYPE_CODES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.uint64: "U64",
}
CODE_DTYPES: dict[str, torch.dtype] = {code: dtype for dtype, code in DTYPE_CODES.items()}


def _check_to_save(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> None:
    for name, tensor in tensors.items():
        if not isinstance(name, str) or name == METADATA_KEY:
            raise SafetensorsError(
                f"cannot save a tensor named {name!r}: names must be str other than {METADATA_KEY!r}"
            )
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in DTYPE_CODES:
            raise SafetensorsError(
                f"tensor {name!r} has dtype {tensor.dtype}, which safetensors files cannot hold here"
            )
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """Write tensors (any device; copied to the host) to a safetensors file, atomically.

    Tensors are laid out largest element size first (then in the given order), which keeps each
    one aligned to its element size.
    """
    _check_to_save(tensors, metadata)
    order = sorted(tensors, key=lambda name: -tensors[name].dtype.itemsize)
    header: dict[str, object] = {METADATA_KEY: dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        tensor = tensors[name]
        nbytes = tensor.numel() * tensor.dtype.itemsize
        header[name] = {
            "dtype": DTYPE_CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)

    def write(file: BinaryIO) -> None:
        file.write(struct.pack("<Q", len(header_bytes)))
        file.write(header_bytes)
        for name in order:
            file.write(tensor_to_bytes(tensors[name]))

    atomic_write(path, write)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    counts = Counter(key for key, _ in pairs)
    duplicates = sorted(key for key, count in counts.items() if count > 1)
    if duplicates:
        raise SafetensorsError(f"header lists {duplicates} more than once")
    return dict(pairs)


def _parse_header(data: bytes, label: str) -> tuple[dict[str, object], int]:
    if len(data) < 8:
        raise SafetensorsError(
            f"{label}: {len(data)} bytes is too short for a safetensors file (needs an 8-byte header length)"
        )
    header_size = struct.unpack_from("<Q", data)[0]
    if header_size > MAX_HEADER_SIZE or 8 + header_size > len(data):
        raise SafetensorsError(
            f"{label}: header length {header_size} is invalid for a file of "
            f"{len(data)} bytes (at most {MAX_HEADER_SIZE})"
        )
    try:
        header = json.loads(data[8 : 8 + header_size].decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError) as error:  # JSONDecodeError, or a number too long to convert
        raise SafetensorsError(f"{label}: header is not valid UTF-8 JSON ({error})") from None
    except RecursionError:
        raise SafetensorsError(f"{label}: header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{label}: header is a JSON {type(header).__name__}, expected an object")
    return header, 8 + header_size


def _parse_metadata(value: object, label: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise SafetensorsError(f"{label}: {METADATA_KEY} must map str to str, got {value!r}")
    return value


def _parse_entry(name: str, entry: object, label: str) -> tuple[torch.dtype, list[int], int, int]:
    where = f"{label}: tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(f"{where} must have exactly dtype, shape and data_offsets, got {entry!r}")
    dtype = CODE_DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise SafetensorsError(f"{where} has unsupported dtype {entry['dtype']!r}; supported: {sorted(CODE_DTYPES)}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**63 for d in shape):
        raise SafetensorsError(f"{where} has invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SafetensorsError(f"{where} has invalid data_offsets {offsets!r}")
    expected = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != expected:
        raise SafetensorsError(
            f"{where} spans {offsets[1] - offsets[0]} bytes, but shape {shape} of {entry['dtype']} needs {expected}"
        )
    return dtype, shape, offsets[0], offsets[1]


def load_safetensors(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file: (tensors in header order, metadata). Bad files raise
    SafetensorsError; the data must be covered exactly by the tensors, without gaps or overlaps."""
    path = Path(path)
    label = str(path)
    if path.is_dir():
        raise IsADirectoryError(f"safetensors path {label!r} is a directory, expected a file")
    data = path.read_bytes()
    header, data_start = _parse_header(data, label)
    metadata = _parse_metadata(header.pop(METADATA_KEY, {}), label)
    entries = {name: _parse_entry(name, entry, label) for name, entry in header.items()}
    position = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != position:
            raise SafetensorsError(
                f"{label}: tensor {name!r} starts at data byte {begin}, "
                f"expected {position} (tensors must be contiguous)"
            )
        position = end
    if data_start + position != len(data):
        raise SafetensorsError(
            f"{label}: the tensors cover {position} bytes of data, but the file holds {len(data) - data_start}"
        )
    view = memoryview(data)
    tensors = {
        name: tensor_from_bytes(view[data_start + begin : data_start + end], dtype, shape)
        for name, (dtype, shape, begin, end) in entries.items()
    }
    return tensors, metadata
