"""`evaluate` gives ORT's eval loss on ORT-made artifacts and checkpoints and writes nothing; `evaluate`
and `generate` refuse bad input in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.paths import FIXTURES
from tests.unit.cli.test_cli import run_cli

CASE = FIXTURES / "mlp_ce_adamw_sched"  # made by onnxruntime-training 1.19.2: expected.json holds its eval losses


@pytest.fixture
def case(tmp_path: Path) -> Path:
    copy = tmp_path / "case"
    shutil.copytree(CASE, copy)
    return copy


def evaluate_json(capsys: pytest.CaptureFixture, *args: object) -> dict:
    status, out, err = run_cli(capsys, "evaluate", *args, "--json")
    assert status == 0, err
    return json.loads(out)


def test_evaluate_gives_ort_eval_losses_and_writes_nothing(capsys, case: Path) -> None:
    expected = json.loads((case / "expected.json").read_text())
    files = {path: path.stat().st_mtime_ns for path in case.rglob("*")}
    data = ("--data", case / "data.npz", "--inputs", "x_eval,y_eval", "--batch-size", 16)
    initial = evaluate_json(capsys, case / "artifacts", *data)
    assert initial["samples"] == 16 and initial["checkpoint"] == str(case / "artifacts" / "checkpoint")
    assert initial["metrics"]["loss"] == pytest.approx(
        expected["gradient_semantics"]["eval_loss_initial_params"], rel=1e-6
    )
    trained = evaluate_json(
        capsys,
        case / "artifacts",
        "--checkpoint",
        case / "final_checkpoint_with_optimizer",
        *data,
        "--metric",
        "accuracy",
        "--metric",
        "accuracy",
    )
    assert list(trained["metrics"]) == ["loss", "accuracy"]
    assert trained["metrics"]["loss"] == pytest.approx(expected["train"]["eval_loss"], rel=1e-6)
    assert 0 <= trained["metrics"]["accuracy"] <= 1
    chunked = evaluate_json(
        capsys,
        case / "artifacts",
        "--checkpoint",
        case / "final_checkpoint_with_optimizer",
        *data[:4],
        "--batch-size",
        5,
    )  # 5 + 5 + 5 + 1 rows: the mean over samples, not over chunks
    assert chunked["metrics"]["loss"] == pytest.approx(expected["train"]["eval_loss"], rel=1e-6)
    status, out, err = run_cli(capsys, "evaluate", case / "artifacts", *data)
    assert status == 0, err
    assert out.splitlines()[1].startswith("  eval loss 1.5008")
    assert {path: path.stat().st_mtime_ns for path in case.rglob("*")} == files


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--metric", "f9"], "metric: expected one of loss, accuracy"),
        (["--checkpoint", "missing"], "checkpoint not found: 'missing'"),
        (["--inputs", "x_eval,nope"], "nope"),
    ],
)
def test_evaluate_refuses_bad_input_in_one_line(capsys, case: Path, monkeypatch, extra, message) -> None:
    monkeypatch.chdir(case)
    status, out, err = run_cli(
        capsys, "evaluate", "artifacts", "--data", "data.npz", "--inputs", "x_eval,y_eval", *extra
    )
    assert status == 1 and err.startswith("ort-torch-train: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_evaluate_needs_an_eval_model(capsys, case: Path) -> None:
    (case / "artifacts" / "eval_model.onnx").unlink()
    status, out, err = run_cli(capsys, "evaluate", case / "artifacts", "--data", case / "data.npz")
    assert status == 1 and "no eval_model.onnx found" in err, err


def test_generate_refuses_bad_input_in_one_line(capsys, case: Path, monkeypatch) -> None:
    monkeypatch.chdir(case)
    model = "base_model.onnx"
    for args, message in [
        (["missing.onnx", "--requires-grad", "all", "--loss", "MSELoss"], "ONNX model not found: 'missing.onnx'"),
        (["expected.json", "--requires-grad", "all", "--loss", "MSELoss"], "is not a readable ONNX model"),
        ([model, "--requires-grad", "0.weight,nope", "--loss", "CrossEntropyLoss"], "'nope' is not among"),
        ([model, "--requires-grad", "all", "--loss", "CrossEntropyLoss", "--lora", "r=x"], "--lora"),
    ]:
        status, out, err = run_cli(capsys, "generate", *args, "--output", "made")
        assert status == 1 and err.startswith("ort-torch-train: error: ") and message in err, (args, err)
        assert not (case / "made").exists()  # nothing written before every argument is checked
    status, out, err = run_cli(capsys, "generate", model, "--loss", "CrossEntropyLoss")
    assert status == 2 and "--requires-grad" in err, err
    (case / "generate.json").write_text(json.dumps({"model": model, "requires_grad": "all", "los": "MSELoss"}))
    status, out, err = run_cli(capsys, "generate", "--config", "generate.json")
    assert status == 2 and "'los' is not an option of `ort-torch-train generate` (did you mean 'loss'?)" in err, err


def test_generate_all_trains_the_floating_point_initializers_less_the_frozen(capsys, case: Path, monkeypatch) -> None:
    monkeypatch.chdir(case)
    status, out, err = run_cli(
        capsys,
        "generate",
        "base_model.onnx",
        "--requires-grad",
        "all",
        "--frozen-params",
        "0.weight",
        "--loss",
        "CrossEntropyLoss",
        "--optimizer",
        "SGD",
        "--output",
        "made",
    )
    assert status == 0, err
    assert "3 trainable parameters, 1 frozen" in out
    status, out, err = run_cli(capsys, "inspect", "made", "--json")
    report = json.loads(out)
    trainable = {p["name"]: p["trainable"] for p in report["parameters"]}
    assert trainable == {"0.weight": False, "0.bias": True, "2.weight": True, "2.bias": True}
    assert report["optimizer"]["algorithm"] == "SGD"

    (case / "generate.json").write_text(
        json.dumps({"model": "base_model.onnx", "requires_grad": "all", "loss": "MSELoss", "output": "from-config"})
    )
    status, out, err = run_cli(
        capsys, "generate", "--config", "generate.json", "--output", "from-flags", "--optimizer", "none"
    )
    assert status == 0, err
    assert "no optimizer model (`train` needs one" in out
    assert not (case / "from-config").exists()  # the flag wins over the file
    assert sorted(path.name for path in (case / "from-flags").iterdir()) == [
        "checkpoint",
        "eval_model.onnx",
        "training_model.onnx",
    ]
