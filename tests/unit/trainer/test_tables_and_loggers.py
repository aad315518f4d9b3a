"""Data files through pyarrow (Parquet, Arrow, CSV, JSONL; bad files and missing columns named) and the
loggers against their real libraries (JSONL, TensorBoard's event files, MLflow's local store)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.errors import InputError
from ort_torch_train.trainer import JsonlLogger, MlflowLogger, TensorBoardLogger
from ort_torch_train.trainer.loggers import tag_of
from ort_torch_train.trainer.tables import read_table

pa = pytest.importorskip("pyarrow")
import pyarrow.csv as pa_csv  # noqa: E402
import pyarrow.feather as pa_feather  # noqa: E402
import pyarrow.parquet as pa_parquet  # noqa: E402

TABLE = {"pixels": [[0.5, 1.0, 1.5], [2.0, 2.5, 3.0]], "label": [1, 0]}


def write(table: pa.Table, path) -> None:
    writers = {
        ".parquet": pa_parquet.write_table,
        ".arrow": pa_feather.write_feather,
        ".csv": pa_csv.write_csv,
    }
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    else:
        writers[path.suffix](table, path)


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_list_columns_become_an_axis(tmp_path, suffix) -> None:
    path = tmp_path / f"data{suffix}"
    write(pa.table(TABLE), path)
    columns = read_table(path)
    assert list(columns) == ["pixels", "label"]
    np.testing.assert_array_equal(columns["pixels"], np.array(TABLE["pixels"]))
    assert columns["label"].dtype == np.int64 and columns["label"].tolist() == [1, 0]


def test_csv_columns_and_a_column_selection(tmp_path) -> None:
    path = tmp_path / "data.csv"
    write(pa.table({"f0": [0.5, 2.0], "f1": [1.0, 2.5], "label": [1, 0]}), path)
    assert read_table(path, ["label"]).keys() == {"label"}
    assert read_table(path)["f1"].tolist() == [1.0, 2.5]


def test_bad_files_and_missing_columns_are_named(tmp_path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="is not a readable parquet file"):
        read_table(tmp_path / "bad.parquet")
    write(pa.table(TABLE), tmp_path / "good.parquet")
    with pytest.raises(InputError, match=r"has no column 'image' \(its columns: pixels, label\)"):
        read_table(tmp_path / "good.parquet", ["image"])
    write(pa.table({"pixels": [[1.0], [1.0, 2.0]]}), tmp_path / "ragged.parquet")
    with pytest.raises(InputError, match="lists of different lengths"):
        read_table(tmp_path / "ragged.parquet")
    write(pa.table({"label": [1, None]}), tmp_path / "holes.parquet")
    with pytest.raises(InputError, match="1 missing values"):
        read_table(tmp_path / "holes.parquet")
    with pytest.raises(InputError, match="unknown data format '.xlsx'"):
        read_table(tmp_path / "data.xlsx")
    with pytest.raises(InputError, match="data file not found"):
        read_table(tmp_path / "nope.csv")


VALUES = [(1, {"loss": 2.5, "lr": 0.001, "steps_per_s": float("nan")}), (2, {"loss": 2.0, "eval_accuracy": 0.5})]


def test_tags_and_the_jsonl_logger(tmp_path) -> None:
    assert [tag_of(name) for name in ("loss", "eval_accuracy", "compile_seconds", "steps_per_s")] == [
        "train/loss",
        "eval/accuracy",
        "compile/seconds",
        "train/steps_per_s",
    ]
    logger = JsonlLogger(tmp_path / "logs" / "m.jsonl")
    for step, values in VALUES:
        logger.log(step, values)
    logger.close()
    lines = [json.loads(line) for line in (tmp_path / "logs" / "m.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "loss": 2.5, "lr": 0.001, "steps_per_s": None}, {"step": 2, **VALUES[1][1]}]


def test_tensorboard_event_file_holds_the_scalars(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb")
    for step, values in VALUES:
        logger.log(step, values)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 2.5), (2, 2.0)]
    assert [e.value for e in events.Scalars("eval/accuracy")] == [0.5]
    assert "train/steps_per_s" not in events.Tags()["scalars"]  # NaN (no rate yet) is left out


def test_mlflow_local_store_holds_the_metrics(tmp_path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    logger = MlflowLogger(tmp_path / "mlruns", "tests", "run-1", {"lr": 0.001})
    for step, values in VALUES:
        logger.log(step, values)
    logger.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.001"}
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "train/loss")] == [(1, 2.5), (2, 2.0)]
    assert run.data.metrics["eval/accuracy"] == 0.5


@pytest.mark.parametrize(
    ("blocked", "make", "hint"),
    [
        (
            "torch.utils.tensorboard",
            lambda tmp: TensorBoardLogger(tmp / "tb"),
            "python -m ort_torch_train.install --extra tensorboard",
        ),
        ("mlflow.tracking", lambda tmp: MlflowLogger(tmp / "ml"), "python -m ort_torch_train.install --extra mlflow"),
        (
            "pyarrow.parquet",
            lambda tmp: read_table(tmp / "x.parquet"),
            "python -m ort_torch_train.install --extra data",
        ),
    ],
)
def test_a_missing_optional_package_says_how_to_install_it(tmp_path, monkeypatch, blocked, make, hint) -> None:
    before = set(sys.modules)
    monkeypatch.setitem(sys.modules, blocked, None)  # import fails as when the package is absent
    try:
        with pytest.raises(InputError, match=re.escape(hint)):
            make(tmp_path)
    finally:  # a package whose import failed halfway leaves submodules bound to a dead parent: drop them
        root = blocked.split(".")[0]
        for name in set(sys.modules) - before:
            if name == root or name.startswith(root + "."):
                del sys.modules[name]


def test_no_install_hint_in_the_package_names_a_pip_extra() -> None:
    """`pip install 'ort-torch-train[EXTRA]'` would let pip replace the user's torch: hints name
    `python -m ort_torch_train.install --extra EXTRA` (or the package itself) instead."""
    package = Path(__file__).resolve().parents[3] / "ort_torch_train"
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"pip install\s+['\"]?ort-torch-train\[", line)
    ]
    assert not found, found
