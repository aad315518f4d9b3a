"""examples/genai_lora.py: a tiny int4 Llama built by onnxruntime-genai's builder learns a text with LoRA
and genai serves the adapter."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime_genai")


@pytest.mark.slow
def test_genai_lora_example(example, built, tmp_path) -> None:
    summary = example("genai_lora").main(["--out", str(tmp_path), "--built", str(built["llama-int4"])])
    assert summary["last_loss"] < summary["first_loss"] - 1.0
    assert summary["with_adapter"].startswith("onnx runtime trains")  # the text it learned, served by genai
    assert not summary["without_adapter"].startswith("onnx runtime")
    assert summary["served"] == [
        "genai_config.json",
        "model.onnx",
        "text.onnx_adapter",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
