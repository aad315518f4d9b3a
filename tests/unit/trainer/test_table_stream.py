"""Tables are read in record batches into the arrays they yield: list columns never pass through Python
lists, values are the same whatever the batch size, and a column the run does not use never blocks it."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ort_torch_train.cli.data import InputSpec, load_data, select_arrays
from ort_torch_train.errors import InputError
from ort_torch_train.trainer.tables import read_table

pa = pytest.importorskip("pyarrow")
import pyarrow.csv as pa_csv  # noqa: E402
import pyarrow.feather as pa_feather  # noqa: E402
import pyarrow.parquet as pa_parquet  # noqa: E402


def test_a_list_column_is_read_without_python_lists(tmp_path) -> None:
    rows, width = 4096, 64
    pixels = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    table = pa.table({"pixels": pa.FixedSizeListArray.from_arrays(pixels.reshape(-1), width)})
    table = table.append_column("nested", pa.array(list(pixels.reshape(rows, 8, 8).tolist())))
    pa_parquet.write_table(table, tmp_path / "t.parquet", row_group_size=500)
    np.testing.assert_array_equal(read_table(tmp_path / "t.parquet", ["pixels"])["pixels"], pixels)
    tracemalloc.start()
    columns = read_table(tmp_path / "t.parquet", ["nested"])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    np.testing.assert_array_equal(columns["nested"], pixels.reshape(rows, 8, 8))
    assert peak < 1.5 * columns["nested"].nbytes  # Python floats for each value took 8x


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".csv", ".jsonl"])
def test_many_record_batches_read_as_one_array(tmp_path, suffix) -> None:
    rows = 3000
    values = {"x": np.arange(rows, dtype=np.float64) / 7, "y": np.arange(rows, dtype=np.int64) * 3}
    path = tmp_path / f"t{suffix}"
    table = pa.table(values)
    if suffix == ".parquet":
        pa_parquet.write_table(table, path, row_group_size=256)
    elif suffix == ".arrow":
        pa_feather.write_feather(table, path, chunksize=256)
    elif suffix == ".csv":
        pa_csv.write_csv(table, path)
    else:
        path.write_text("".join(f'{{"x": {x!r}, "y": {y}}}\n' for x, y in zip(values["x"].tolist(), values["y"])))
    columns = read_table(path)
    assert list(columns) == ["x", "y"]
    np.testing.assert_array_equal(columns["x"], values["x"])
    np.testing.assert_array_equal(columns["y"], values["y"])


def test_lists_of_another_length_in_a_later_batch_are_named(tmp_path) -> None:
    batches = [pa.table({"p": [[1.0, 2.0]] * 300}), pa.table({"p": [[1.0, 2.0]] * 10 + [[1.0]]})]
    pa_parquet.write_table(pa.concat_tables(batches), tmp_path / "r.parquet", row_group_size=300)
    with pytest.raises(InputError, match=r"column 'p' holds lists of different lengths \(2, 1\)"):
        read_table(tmp_path / "r.parquet")


def test_an_unused_ragged_or_null_column_does_not_block_loading(tmp_path) -> None:
    table = pa.table({"x": [1.0, 2.0, 3.0], "notes": [[1], [1, 2], []], "comment": ["a", None, "c"]})
    pa_parquet.write_table(table, tmp_path / "t.parquet")
    arrays, is_table = load_data(tmp_path / "t.parquet")
    selected = select_arrays(arrays, [InputSpec("x", "float32", ["batch"])], None, "'t.parquet'", "--inputs", is_table)
    assert selected["x"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(InputError, match="column 'notes' holds lists of different lengths"):
        select_arrays(arrays, [InputSpec("x", "int64", ["batch"])], "x=notes", "'t.parquet'", "--inputs", is_table)


def test_parquet_row_groups_larger_than_a_batch_are_read_in_batches(tmp_path, monkeypatch) -> None:
    from ort_torch_train.trainer import table_stream

    monkeypatch.setattr(table_stream, "BATCH_ROWS", 100)
    pixels = np.arange(1000 * 6, dtype=np.float32).reshape(1000, 6)
    table = pa.table({"p": pa.FixedSizeListArray.from_arrays(pixels.reshape(-1), 6), "y": np.arange(1000)})
    pa_parquet.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    columns = read_table(tmp_path / "t.parquet")
    np.testing.assert_array_equal(columns["p"], pixels)
    assert columns["y"].tolist() == list(range(1000))
