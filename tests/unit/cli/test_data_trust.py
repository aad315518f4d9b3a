"""Table columns reach the model's inputs without silent narrowing (integer ranges, finite floats), and
columns the run does not use never block loading."""

from __future__ import annotations

import numpy as np
import pytest

from ort_torch_train.cli.common import CliError
from ort_torch_train.cli.data import InputSpec, select_arrays
from ort_torch_train.errors import InputError


@pytest.mark.parametrize(
    ("values", "dtype", "expected"),
    [
        (np.array([1, 2**32 + 3], dtype=np.int64), "int32", r"column 'c'.*4294967299.*int32"),
        (np.array([-(2**31) - 1, 0], dtype=np.int64), "int32", r"column 'c'.*-2147483649.*int32"),
        (np.array([2**63 + 1], dtype=np.uint64), "int64", r"column 'c'.*9223372036854775809.*int64"),
        (np.array([1.0, 1e300]), "float32", r"column 'c'.*1e\+300.*float32"),
        (np.array([2**40], dtype=np.int64), "float16", r"column 'c'.*1099511627776.*float16"),
    ],
)
def test_a_value_that_does_not_fit_the_input_dtype_is_refused_naming_the_column(values, dtype, expected) -> None:
    spec = InputSpec("x", dtype, ["batch"])
    with pytest.raises((CliError, InputError), match=expected):
        select_arrays({"c": values}, [spec], "x=c", "'t.parquet'", "--inputs", table=True)


def test_values_that_fit_convert_and_non_finite_floats_stay_as_they_were() -> None:
    arrays = {"i": np.array([-(2**31), 2**31 - 1], dtype=np.int64), "f": np.array([np.nan, np.inf, 1.5])}
    specs = [InputSpec("i", "int32", ["batch"]), InputSpec("f", "float32", ["batch"])]
    selected = select_arrays(arrays, specs, None, "'t.parquet'", "--inputs", table=True)
    assert selected["i"].dtype == np.int32 and selected["i"].tolist() == [-(2**31), 2**31 - 1]
    assert (
        selected["f"].dtype == np.float32 and np.isnan(selected["f"][0]) and selected["f"][1:].tolist() == [np.inf, 1.5]
    )
