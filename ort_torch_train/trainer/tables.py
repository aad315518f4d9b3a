"""Columns of a local Parquet, Arrow (IPC/Feather), CSV or JSONL file as numpy arrays, through pyarrow
(``python -m ort_torch_train.install --extra data``, or ``pip install pyarrow``).

A column of numbers becomes a 1-D array; a column of equally long lists (nested lists too) becomes
an array with one more axis per nesting level, e.g. an image column of 144 floats -> [rows, 144].
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ort_torch_train.errors import InputError
from ort_torch_train.trainer.table_stream import TableColumns

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
    """Column name -> array of a table file (only ``columns`` when given), in the file's column order; the
    file is read in record batches (``trainer/table_stream.py``)."""
    path = Path(path)
    kind = table_format(path)
    if kind is None:
        raise InputError(
            f"{str(path)!r}: unknown data format {path.suffix!r}; expected one of {', '.join(sorted(TABLE_FORMATS))}"
        )
    table = TableColumns(path, kind)
    names = table.require(columns) if columns is not None else list(table)
    table.load(names)
    return {name: table[name] for name in names}
