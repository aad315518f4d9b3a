"""Model files in ONNX Runtime's own format (.ort, made here by onnxruntime itself) are refused as such, from a
path and from bytes, for the training, eval and optimizer models; a file in neither format says which were tried."""

from __future__ import annotations

from pathlib import Path

import pytest

from ort_torch_train.errors import ModelError, OrtFormatModelError
from ort_torch_train.graph.layout import load_model
from ort_torch_train.optim.optimizer_model import read_optimizer_model
from tests.helpers.ort_format import save_in_ort_format
from tests.helpers.paths import ROOT

MLP = ROOT / "tests" / "fixtures" / "mlp_ce_adamw_sched" / "artifacts"


@pytest.fixture(scope="module")
def ort_format_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's eval model saved by onnxruntime in ORT format."""
    return save_in_ort_format(MLP / "eval_model.onnx", tmp_path_factory.mktemp("ort_format") / "eval_model.ort")


def test_an_ort_format_model_is_refused_naming_the_format(ort_format_model: Path) -> None:
    for source in (ort_format_model, ort_format_model.read_bytes()):
        with pytest.raises(OrtFormatModelError, match=r"eval model is an ORT-format model \(\.ort, FlatBuffers\)"):
            load_model(source, "eval model")
        with pytest.raises(OrtFormatModelError, match="optimizer model.* is an ORT-format model"):
            read_optimizer_model(source)
    assert issubclass(OrtFormatModelError, NotImplementedError)  # the C API's ORT_NOT_IMPLEMENTED


def test_a_file_in_neither_format_names_both(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x18\x00\x00\x00ORTX" + bytes(range(64)))
    with pytest.raises(ModelError, match="not a readable ONNX model .*nor an ORT-format model"):
        load_model(garbage, "training model")
    with pytest.raises(ModelError, match="nor an ORT-format model"):
        read_optimizer_model(garbage.read_bytes())
