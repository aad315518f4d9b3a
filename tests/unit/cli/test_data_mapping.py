"""Data mapping of the CLI: column lists per input, patterns that leave out the columns other inputs
name (and show what they caught), 1-D columns for [batch, 1] inputs, unknown file formats refused."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from ort_torch_train.cli.common import CliError
from ort_torch_train.cli.data import InputSpec, input_mapping, load_data, select_arrays

SPECS = [InputSpec("features", "float32", ["batch", 3]), InputSpec("target", "float32", ["batch", 1])]


def table() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(6) for name in ("age", "sex", "bmi", "y")}


def test_an_input_lists_its_columns() -> None:
    assert input_mapping("features=age,sex,bmi,target=y", ["features", "target"], "--inputs") == {
        "features": "age,sex,bmi",
        "target": "y",
    }
    columns = table()
    selected = select_arrays(columns, SPECS, "features=age,sex,bmi,target=y", "'t.csv'", "--inputs", table=True)
    assert selected["features"].shape == (6, 3) and selected["features"].dtype == np.float32
    np.testing.assert_array_equal(selected["features"][:, 2], columns["bmi"].astype(np.float32))
    assert selected["target"].shape == (6, 1)  # a 1-D column fills a [batch, 1] input


def test_a_pattern_leaves_out_named_columns_and_shows_what_it_caught(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="ort_torch_train"):
        selected = select_arrays(table(), SPECS, "features=*,target=y", "'t.csv'", "--inputs", table=True)
    assert selected["features"].shape == (6, 3)
    assert "columns age, sex, bmi (from '*')" in caplog.text
    too_many = [InputSpec("features", "float32", ["batch", 2]), SPECS[1]]
    with pytest.raises(CliError, match=r"columns age, sex, bmi \(from '\*'\).*dimension 1 is 3, expected 2"):
        select_arrays(table(), too_many, "features=*,target=y", "'t.csv'", "--inputs", table=True)


def test_missing_names_hint_at_column_lists() -> None:
    with pytest.raises(CliError, match=r"--inputs features=COL1,COL2,...,target=COL"):
        select_arrays(table(), SPECS, None, "'t.csv'", "--inputs", table=True)


def test_unknown_extension_is_refused_by_name(tmp_path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("a\tb\n1\t2\n")
    with pytest.raises(CliError, match=r"unknown data format '\.tsv'; expected \.npz, .*\.csv"):
        load_data(path)
