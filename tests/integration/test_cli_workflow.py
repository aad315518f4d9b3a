"""docs/cli.md's "From an ONNX model to onnxruntime" runs as written: `generate` from an ONNX file (with
flags, and with the page's --config file: the same bytes), `train`, `evaluate` (which writes nothing and
gives what onnxruntime computes on the exported model, and what `train --eval-data` reports), `export`."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled
from tests.unit.cli.test_cli import run_cli

SECTION = "### From an ONNX model to onnxruntime"


def example() -> tuple[str, list[list[str]], str]:
    """The section's data-making Python, its commands and its config file."""
    section = (ROOT / "docs" / "cli.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    make = re.findall(r"```\n(python -c .*?)```", section, flags=re.DOTALL)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0].strip().splitlines()
    config = re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)[0]
    return shlex.split(make)[2], [shlex.split(command) for command in commands], config


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.slow
def test_generate_train_evaluate_export_agree_with_onnxruntime(capsys, tmp_path, monkeypatch) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("yaml")
    code, commands, config = example()
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=scaled(120))
    monkeypatch.chdir(tmp_path)
    assert [command[:2] for command in commands] == [
        ["ort-torch-train", "generate"],
        ["ort-torch-train", "train"],
        ["ort-torch-train", "evaluate"],
        ["ort-torch-train", "export"],
    ]
    generate, train, evaluate, export = (command[1:] for command in commands)

    status, out, err = run_cli(capsys, *generate)
    assert status == 0, err
    assert "4 trainable parameters" in out
    files = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")
    made = {name: (tmp_path / "mlp" / name).read_bytes() for name in files}
    (tmp_path / "generate.yaml").write_text(config)
    (tmp_path / "mlp").rename(tmp_path / "mlp-flags")
    status, out, err = run_cli(capsys, "generate", "--config", "generate.yaml")
    assert status == 0, err
    assert {name: (tmp_path / "mlp" / name).read_bytes() for name in files} == made

    status, out, err = run_cli(capsys, *train)
    assert status == 0, err
    assert "trained steps 1-60" in out

    before = snapshot(tmp_path)
    status, out, err = run_cli(capsys, *evaluate)
    assert status == 0, err
    assert "eval accuracy" in out and "(100 samples)" in out
    status, out, err = run_cli(capsys, *evaluate, "--json")
    assert status == 0, err
    assert snapshot(tmp_path) == before  # evaluate writes nothing
    result = json.loads(out)
    assert result["samples"] == 100 and set(result["metrics"]) == {"loss", "accuracy"}

    status, out, err = run_cli(capsys, *export)
    assert status == 0, err
    test = np.load(tmp_path / "mlp-test.npz")
    session = ort.InferenceSession(str(tmp_path / "mlp-trained.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"features": test["features"]})
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(logits)), test["labels"]].mean()
    accuracy = (logits.argmax(axis=1) == test["labels"]).mean()
    assert result["metrics"]["accuracy"] == accuracy
    assert result["metrics"]["loss"] == pytest.approx(loss, rel=1e-5)
    assert accuracy > 0.6  # the run learned the rule that made the labels (chance is 0.2)

    status, out, err = run_cli(
        capsys,
        *train[:-2],
        "--output",
        "eval-run/ckpt",
        "--eval-data",
        "mlp-test.npz",
        "--metric",
        "accuracy",
        "--json",
    )
    assert status == 0, err
    reported = json.loads(out)["eval_metrics"]
    status, out, err = run_cli(capsys, *evaluate[:2], "--checkpoint", "eval-run/ckpt", *evaluate[4:], "--json")
    assert status == 0, err
    assert json.loads(out)["metrics"] == reported
