"""Columns of a local Parquet, Arrow (IPC/Feather), CSV or JSONL file as numpy arrays, through pyarrow
(the ``data`` extra: ``pip install 'ort-torch-train[data]'``).

A column of numbers becomes a 1-D array; a column of equally long lists (nested lists too) becomes
an array with one more axis per nesting level, e.g. an image column of 144 floats -> [rows, 144].
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ort_torch_train.errors import InputError

TABLE_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


def table_format(path: str | os.PathLike) -> str | None:
    """The table format a file's suffix names, or None (not a table file)."""
    return TABLE_FORMATS.get(Path(path).suffix.lower())


def read_table(path: str | os.PathLike, columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """Column name -> array of a table file (only ``columns`` when given), in the file's column order."""
    path = Path(path)
    kind = table_format(path)
    if kind is None:
        raise InputError(
            f"{str(path)!r}: unknown data format {path.suffix!r}; expected one of {', '.join(sorted(TABLE_FORMATS))}"
        )
    table = _read(path, kind)
    names = list(table.column_names)
    if columns is not None:
        missing = [name for name in columns if name not in names]
        if missing:
            raise InputError(f"{str(path)!r} has no column {missing[0]!r} (its columns: {', '.join(names)})")
        names = columns
    return {name: column_array(table.column(name), f"{str(path)!r} column {name!r}") for name in names}


def _read(path: Path, kind: str) -> Any:
    try:
        import pyarrow as pa
        import pyarrow.csv as pa_csv
        import pyarrow.feather as pa_feather
        import pyarrow.json as pa_json
        import pyarrow.parquet as pa_parquet
    except ImportError as error:
        raise InputError(
            f"reading {path.suffix} files needs pyarrow: pip install 'ort-torch-train[data]' (or pip install pyarrow)"
        ) from error
    if not path.is_file():
        raise InputError(f"data file not found: {str(path)!r}")
    readers = {
        "parquet": pa_parquet.read_table,
        "arrow": pa_feather.read_table,
        "csv": pa_csv.read_csv,
        "jsonl": pa_json.read_json,
    }
    try:
        return readers[kind](path)
    except (pa.ArrowException, OSError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{str(path)!r} is not a readable {kind} file ({message})") from error


def column_array(column: Any, what: str) -> np.ndarray:
    """A pyarrow column as a numpy array; lists of equal length stacked into further axes."""
    if column.null_count:
        raise InputError(f"{what} has {column.null_count} missing values")
    values = column.to_pylist() if _is_list(column.type) else None
    if values is None:
        return column.to_numpy()
    try:
        array = np.array(values)
    except ValueError:
        array = np.array([], dtype=object)
    if array.dtype == object or array.ndim < 2:
        lengths = sorted({len(value) for value in values if isinstance(value, list)})
        raise InputError(f"{what} holds lists of different lengths ({', '.join(map(str, lengths[:5]))}...)")
    return array


def _is_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)
    )
