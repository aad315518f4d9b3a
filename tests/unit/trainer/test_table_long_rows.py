"""A CSV or JSONL cell longer than pyarrow's default read block (1 MiB), in a used column or not, no longer
makes the file unreadable: the block grows to hold the row, up to a limit past which the row is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ort_torch_train.errors import InputError
from ort_torch_train.trainer import table_stream
from ort_torch_train.trainer.tables import read_table

pytest.importorskip("pyarrow")
LONG = "x" * (3 << 20)  # 3 MiB: three default blocks


def write(path, rows: list[dict]) -> None:
    if path.suffix == ".csv":
        path.write_text("a,b,note\n" + "".join(f"{row['a']},{row['b']},{row['note']}\n" for row in rows))
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_cell_over_a_block_in_an_unused_or_used_column_reads(tmp_path, suffix) -> None:
    rows = [{"a": i, "b": 2.5 * i, "note": LONG if i == 700 else "n"} for i in range(1000)]
    path = tmp_path / f"long{suffix}"
    write(path, rows)
    table = read_table(path, ["a", "b"])
    np.testing.assert_array_equal(table["a"], np.arange(1000))
    np.testing.assert_array_equal(table["b"], 2.5 * np.arange(1000))
    notes = read_table(path, ["note"])["note"]
    assert len(notes[700]) == len(LONG) and notes[699] == "n"


def test_a_row_over_the_largest_block_is_refused_by_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(table_stream, "MAX_TEXT_BLOCK_BYTES", 1 << 20)
    path = tmp_path / "long.csv"
    write(path, [{"a": i, "b": i, "note": LONG if i == 3 else "n"} for i in range(10)])
    with pytest.raises(InputError, match=r"'.*long\.csv' holds a row too long to read in blocks of 1048576 bytes"):
        read_table(path, ["a"])
