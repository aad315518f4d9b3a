"""Columns of a table file read in record batches (pyarrow's dataset scanner) straight into the numpy arrays
they yield: memory holds those arrays and a few batches, never the whole table nor Python lists of values.

``TableColumns`` is a file's columns by name, each read when first used (``load`` reads several in one
pass), so a column the run does not use (ragged lists, missing values, text) never blocks it; a CSV or
JSONL row longer than a read block makes the block grow to hold it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ort_torch_train.errors import InputError

DATASET_FORMATS = {"parquet": "parquet", "arrow": "ipc", "csv": "csv", "jsonl": "json"}
BATCH_ROWS = 65536  # rows per record batch read
READ_BUFFER_BYTES = 1 << 20  # a Parquet column chunk is read in pieces of this size
TEXT_BLOCK_BYTES = 1 << 20  # a CSV or JSONL file is read in blocks of this size at first, doubled for a longer row
MAX_TEXT_BLOCK_BYTES = 1 << 30  # a row longer than this is refused


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow as pa
        import pyarrow.dataset  # noqa: F401  (pa.dataset)
        import pyarrow.parquet  # noqa: F401  (the parquet format of pa.dataset)
    except ImportError as error:
        raise InputError(
            f"reading {path.suffix} files needs pyarrow: python -m ort_torch_train.install --extra data (or pip install pyarrow)"
        ) from error
    return pa


class TableColumns(Mapping[str, np.ndarray]):
    """The columns of the table file ``path`` (format ``kind``: parquet, arrow, csv, jsonl) by name, in the
    file's order; a column is read (streamed) when first used."""

    def __init__(self, path: str | os.PathLike, kind: str) -> None:
        self.path = Path(path)
        self.kind = kind
        self.label = repr(str(self.path))
        self._pa = _pyarrow(self.path)
        if not self.path.is_file():
            raise InputError(f"data file not found: {self.label}")
        self._block_bytes = TEXT_BLOCK_BYTES
        self._dataset = self._guarded(self._open)
        self._names = list(self._dataset.schema.names)
        self._arrays: dict[str, np.ndarray] = {}

    def _open(self) -> Any:
        dataset = self._pa.dataset
        try:
            return dataset.dataset(self.path, format=self._format())
        except self._pa.ArrowInvalid:
            if self.kind != "arrow":
                raise
            import pyarrow.feather as pa_feather  # a Feather v1 file: read whole (the format has no batches)

            return dataset.dataset(pa_feather.read_table(self.path))

    def _format(self) -> Any:
        """The dataset format, with the current block size for CSV and JSONL."""
        dataset = self._pa.dataset
        if self.kind == "csv":
            import pyarrow.csv as pa_csv

            return dataset.CsvFileFormat(read_options=pa_csv.ReadOptions(block_size=self._block_bytes))
        if self.kind == "jsonl":
            import pyarrow.json as pa_json

            return dataset.JsonFileFormat(read_options=pa_json.ReadOptions(block_size=self._block_bytes))
        return DATASET_FORMATS[self.kind]

    def _guarded(self, read: Any) -> Any:
        """``read()``, again on the file reopened with twice the block size while a CSV or JSONL row
        straddles two blocks; an InputError naming the file when it cannot be read."""
        reopen = False
        while True:
            try:
                if reopen:
                    self._dataset = self._open()
                return read()
            except (self._pa.ArrowException, OSError) as error:
                message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                if "straddl" not in message or self.kind not in ("csv", "jsonl"):
                    raise InputError(f"{self.label} is not a readable {self.kind} file ({message})") from error
                if self._block_bytes >= MAX_TEXT_BLOCK_BYTES:
                    raise InputError(
                        f"{self.label} holds a row too long to read in blocks of {MAX_TEXT_BLOCK_BYTES} bytes, the largest"
                    ) from error
                self._block_bytes *= 2
                reopen = True

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            if name not in self._names:
                raise KeyError(name)
            self.load([name])
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def require(self, names: Iterable[str]) -> list[str]:
        """``names`` as given; an InputError for the first the file lacks."""
        names = list(names)
        missing = [name for name in names if name not in self._names]
        if missing:
            raise InputError(f"{self.label} has no column {missing[0]!r} (its columns: {', '.join(self._names)})")
        return names

    def load(self, names: Iterable[str]) -> None:
        """Read the columns ``names`` not read yet, in one pass over the file."""
        missing = [name for name in dict.fromkeys(self.require(names)) if name not in self._arrays]
        if missing:
            self._arrays.update(self._guarded(lambda: self._scan(missing)))

    def _scan(self, names: list[str]) -> dict[str, np.ndarray]:
        rows = self._dataset.count_rows()
        arrays: dict[str, np.ndarray] = {}
        start = 0
        for batch in self._batches(names):
            count = batch.num_rows
            for name in names:
                what = f"{self.label} column {name!r}"
                block = column_block(batch.column(name), what)
                if name not in arrays:
                    arrays[name] = np.empty((rows, *block.shape[1:]), dtype=block.dtype)
                elif block.shape[1:] != arrays[name].shape[1:]:
                    raise InputError(f"{what} holds lists of different lengths ({_lengths(arrays[name], block)})")
                arrays[name][start : start + count] = block
            start += count
        for name in names:
            if name not in arrays:  # no rows
                arrays[name] = np.empty((0,), dtype=_numpy_dtype(self._dataset.schema.field(name).type))
        return arrays

    def _batches(self, names: list[str]) -> Iterator[Any]:
        """The record batches of the columns ``names``: a Parquet file through its batch reader, reading each
        column chunk in buffered pieces (the dataset scanner decodes row groups ahead, and a whole column
        chunk is read at once without a buffer size), other formats through the dataset scanner."""
        if self.kind != "parquet":
            yield from self._dataset.to_batches(columns=names, batch_size=BATCH_ROWS, batch_readahead=1)
            return
        import pyarrow.parquet as pa_parquet

        with pa_parquet.ParquetFile(self.path, pre_buffer=False, buffer_size=READ_BUFFER_BYTES) as file:
            yield from file.iter_batches(BATCH_ROWS, columns=names, use_threads=False)


def column_block(array: Any, what: str) -> np.ndarray:
    """One record batch's column as a numpy array; lists of equal length become further axes."""
    import pyarrow as pa

    if array.null_count:
        raise InputError(f"{what} has {array.null_count} missing values")
    kind = array.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(kind):
        width = kind.list_size
    else:
        lengths = np.diff(np.asarray(array.offsets))
        width = int(lengths[0]) if len(lengths) else 0
        if len(lengths) and (lengths != width).any():
            other = int(lengths[np.argmax(lengths != width)])
            raise InputError(f"{what} holds lists of different lengths ({width}, {other})")
    values = column_block(array.flatten(), what)
    return values.reshape(len(array), width, *values.shape[1:])


def _lengths(first: np.ndarray, later: np.ndarray) -> str:
    return f"{first.shape[1] if first.ndim > 1 else 'numbers'}, {later.shape[1] if later.ndim > 1 else 'numbers'}"


def _numpy_dtype(arrow_type: Any) -> np.dtype:
    try:
        return np.dtype(arrow_type.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        return np.dtype(object)
