"""`train --lora`, `export --output/--unmerged/--adapter` and `inspect` on LoRA artifacts and checkpoints."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ort_torch_train.cli.main import main
from ort_torch_train.lora import LoraConfig
from ort_torch_train.state.training_state import TrainingState
from tests.unit.lora.helpers import make_artifacts

ort = pytest.importorskip("onnxruntime")


def cli(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_train_lora_then_export_for_onnxruntime(tmp_path, capsys) -> None:
    make_artifacts(tmp_path / "artifacts", None)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 8), dtype=np.float32)
    np.savez(tmp_path / "data.npz", x=x, y=x[:, :4].argmax(axis=1).astype(np.int64))
    code, _, err = cli(
        capsys, "train", tmp_path / "artifacts", "--data", tmp_path / "data.npz", "--inputs", "x,y",
        "--batch-size", 6, "--steps", 4, "--lr", 0.05, "--lora", "r=2,alpha=4,targets=0.weight,2.weight",
        "--output", tmp_path / "run" / "checkpoint", "-q",
    )  # fmt: skip
    assert code == 0, err
    state = TrainingState.load(tmp_path / "run" / "checkpoint")
    assert sorted(state.trainable_names()) == [
        "0.lora_A.weight",
        "0.lora_B.weight",
        "2.lora_A.weight",
        "2.lora_B.weight",
    ]
    assert LoraConfig.from_json(str(state.properties["ort_torch_train.lora"])).r == 2

    artifacts = tmp_path / "artifacts"
    code, out, err = cli(capsys, "inspect", artifacts / "eval_model.onnx", tmp_path / "run" / "checkpoint")
    assert code == 0, err
    assert "LoRA (from the checkpoint, targets ['0.weight', '2.weight']): r 2, alpha 4" in out
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert rows["0.weight"] == "frozen" and rows["0.lora_A.weight"] == "trainable", out

    code, out, err = cli(
        capsys, "export", tmp_path / "artifacts", "--checkpoint", tmp_path / "run" / "checkpoint",
        "--output", tmp_path / "merged.onnx", "--unmerged", tmp_path / "unmerged.onnx",
        "--adapter", tmp_path / "task.onnx_adapter",
    )  # fmt: skip
    assert code == 0, err
    assert "outputs logits" in out
    adapter = ort.LoraAdapter()
    adapter.Load(str(tmp_path / "task.onnx_adapter"))
    options = ort.RunOptions()
    options.add_active_adapter(adapter)
    merged = ort.InferenceSession(str(tmp_path / "merged.onnx")).run(None, {"features": x})[0]
    unmerged = ort.InferenceSession(str(tmp_path / "unmerged.onnx")).run(None, {"features": x}, options)[0]
    np.testing.assert_allclose(unmerged, merged, atol=1e-5)


def test_inspect_generated_lora_artifacts(tmp_path, capsys) -> None:
    make_artifacts(tmp_path, LoraConfig(r=3, alpha=6, targets=["all-linear"]))
    code, out, err = cli(capsys, "inspect", tmp_path)
    assert code == 0, err
    assert "LoRA (in the models): r 3, alpha 6.0 (scale 2.0); 2 adapted weights" in out
    assert "0.weight  8x16  0.lora_A.weight  0.lora_B.weight" in out


def test_export_external_data_and_errors(tmp_path, capsys) -> None:
    make_artifacts(tmp_path, None)
    code, out, err = cli(capsys, "export", tmp_path, "--output", tmp_path / "model.onnx", "--external-data")
    assert code == 0, err
    assert (tmp_path / "model.onnx.data").is_file()
    assert onnx.load(tmp_path / "model.onnx").graph.output[0].name == "logits"
    code, _, err = cli(capsys, "export", tmp_path, "--adapter", tmp_path / "a.onnx_adapter")
    assert code == 1 and "hold no LoRA adapters; give --lora" in err
    code, _, err = cli(capsys, "export", tmp_path, "--output", tmp_path / "m.onnx", "--lora", "r=0")
    assert code == 1 and "r: expected an integer rank > 0, got 0" in err
    code, _, err = cli(capsys, "export", tmp_path)
    assert code == 1 and "nothing to export" in err
