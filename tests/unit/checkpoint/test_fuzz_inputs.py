"""A small sample of the mutational fuzz (tools/fuzz_inputs.py runs 20,000): project errors only."""

from __future__ import annotations

from tests.helpers.paths import ROOT
from tests.helpers.scripts import load_script

fuzz_inputs = load_script(ROOT / "tools" / "fuzz_inputs.py")


def test_mutated_inputs_load_or_raise_project_errors() -> None:
    result = fuzz_inputs.fuzz(600, seed=14)
    assert [text for _, text, _ in result["unexpected"]] == []
    for name in ("checkpoint", "safetensors", "onnx"):  # both paths exercised for each format
        assert result["outcomes"].get(f"{name}: loaded", 0) > 5
        assert result["outcomes"].get(f"{name}: project error", 0) > 50


def test_safetensors_header_bombs_raise_project_errors(tmp_path) -> None:
    import struct

    import pytest

    from ort_torch_train.checkpoint.safetensors import load_safetensors
    from ort_torch_train.errors import SafetensorsError

    for header in (
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a": ' + b"9" * 5000 + b"}",
        b'{"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}',
    ):
        path = tmp_path / "bomb.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
        with pytest.raises(SafetensorsError):
            load_safetensors(path)
