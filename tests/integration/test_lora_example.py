"""examples/lora_finetune.py with a small run: two adapters on one base, checked in onnxruntime."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


@pytest.mark.slow
def test_lora_finetune_example(example, tmp_path) -> None:
    summary = example("lora_finetune").main(["--steps", "50", "--hidden", "16", "--rank", "4", "--out", str(tmp_path)])
    assert summary["trainable_parameters"] < summary["all_parameters"] / 2
    for task, result in summary["tasks"].items():
        assert result["last_loss"] < result["first_loss"] - 0.3
        assert result["max_difference_to_merged"] < 1e-5
        other = next(name for name in result["accuracy"] if name != task)
        assert result["accuracy"][task] > 0.9 > result["accuracy"][other]
    assert (tmp_path / "unmerged.onnx").is_file() and (tmp_path / "plus_two.onnx_adapter").is_file()
