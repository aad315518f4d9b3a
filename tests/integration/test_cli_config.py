"""scikit-learn's digits (a classifier) and diabetes (a regressor) trained from Parquet and CSV files through
``ort-torch-train train --config`` (YAML and TOML), with flags overriding the file, the resolved options
saved beside the checkpoint and read back by ``--resume``, and a metric that does not fit refused.
Every option used here is one docs/cli.md shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.paths import ROOT
from tests.unit.cli.test_cli import run_cli

pytestmark = pytest.mark.slow

DIGITS_YAML = """\
artifacts: digits
data: digits.{train}
inputs:
  features: px*
  labels: label
batch_size: 32
max_steps: 150
lr: 0.01
eval_data: digits-eval.{eval}
metric: accuracy
output: run/digits-{train}
"""

DIABETES_TOML = """\
artifacts = "diabetes"
data = "diabetes.{train}"
inputs = {{ features = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"] }}
batch_size = 32
max_steps = 100
lr = 0.01
eval_data = "diabetes-eval.{eval}"
metric = "r2"
output = "run/diabetes-{train}"
"""


def write_table(columns: dict[str, np.ndarray], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pa_parquet

    table = pa.table(columns)
    (pa_parquet.write_table if path.suffix == ".parquet" else pa_csv.write_csv)(table, path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both data sets as Parquet and CSV (train and eval splits) and their artifacts."""
    pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("sklearn.datasets")
    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

    root = tmp_path_factory.mktemp("config")
    digits = datasets.load_digits()
    columns = {f"px{i}": (digits.data[:, i] / 16).astype(np.float32) for i in range(64)}
    columns["label"] = digits.target.astype(np.int64)
    diabetes = datasets.load_diabetes()
    target = (diabetes.target - diabetes.target.mean()) / diabetes.target.std()
    regression = {name: diabetes.data[:, i].astype(np.float32) for i, name in enumerate(diabetes.feature_names)}
    regression["target"] = target.astype(np.float32)  # one value per row: fills the [batch, 1] target
    for name, table, split in (("digits", columns, 1500), ("diabetes", regression, 400)):
        for suffix in ("parquet", "csv"):
            write_table({k: v[:split] for k, v in table.items()}, root / f"{name}.{suffix}")
            write_table({k: v[split:] for k, v in table.items()}, root / f"{name}-eval.{suffix}")
    torch.manual_seed(0)
    for name, features, classes, loss in (
        ("digits", 64, 10, LossType.CrossEntropyLoss),
        ("diabetes", 10, 1, LossType.MSELoss),
    ):
        model = torch.nn.Sequential(torch.nn.Linear(features, 32), torch.nn.ReLU(), torch.nn.Linear(32, classes))
        generate_artifacts(
            model,
            example_inputs=(torch.zeros(8, features),),
            input_names=["features"],
            output_names=["logits"],
            dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}},
            loss=loss,
            optimizer=OptimType.AdamW,
            artifact_directory=root / name,
        )
    return root


@pytest.mark.parametrize("train_format", ["parquet", "csv"])
def test_digits_and_diabetes_train_from_config_files(capsys, workdir, monkeypatch, train_format) -> None:
    monkeypatch.chdir(workdir)
    other = "csv" if train_format == "parquet" else "parquet"
    Path(f"digits-{train_format}.yaml").write_text(DIGITS_YAML.format(train=train_format, eval=other))
    Path(f"diabetes-{train_format}.toml").write_text(DIABETES_TOML.format(train=train_format, eval=other))

    code, out, err = run_cli(capsys, "train", "--config", f"digits-{train_format}.yaml")
    assert code == 0, err
    accuracy = float(re.search(r"eval accuracy ([\d.]+)", out).group(1))
    assert accuracy > 0.8, out

    flags = ["--max-steps", "200", "--grad-accum", "2", "--grad-accum-mode", "mean"]  # override the file's
    code, out, err = run_cli(capsys, "train", "--config", f"diabetes-{train_format}.toml", *flags)
    assert code == 0, err
    assert "gradients averaged" in out and "trained steps 1-200" in out
    r2 = float(re.search(r"eval r2 ([-\d.]+)", out).group(1))
    assert r2 > 0.4, out
    saved = json.loads(Path(f"run/diabetes-{train_format}.options.json").read_text())
    assert saved["max_steps"] == 200 and saved["grad_accum_mode"] == "mean" and saved["data"].endswith(train_format)

    code, out, err = run_cli(capsys, "train", "--resume", f"run/diabetes-{train_format}", "--max-steps", "220")
    assert code == 0, err  # data, inputs, artifacts and output come from the saved options
    assert "trained steps 201-220" in out and "gradients averaged" in out

    code, _, err = run_cli(capsys, "train", "--config", f"diabetes-{train_format}.toml", "--metric", "accuracy")
    assert code == 1 and "a regression target; use --metric mae, rmse or r2" in err


def test_the_options_used_are_documented() -> None:
    docs = (ROOT / "docs" / "cli.md").read_text()
    keys = re.findall(r"^(\w+)\s*[:=]", DIGITS_YAML + DIABETES_TOML, flags=re.M)
    for option in {*keys, "grad_accum_mode", "config", "resume"} - {"artifacts"}:
        assert f"--{option.replace('_', '-')}" in docs or f"{option}:" in docs, option
