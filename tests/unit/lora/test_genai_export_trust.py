"""``export_for_genai`` writes only inside the output folder: a model file name from ``genai_config.json``
that leaves it (``..``, absolute, a symlink there) is refused naming the key and the value, the base
model's own folder is refused by name, and so is an adapter name that is no plain file name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ort_torch_train.errors import PathOutsideError
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.genai import export_for_genai
from tests.unit.lora.helpers import make_artifacts, trained

pytest.importorskip("onnxruntime")
VICTIM = b"the user's model, not ours to replace"


@pytest.fixture
def trained_module(tmp_path):
    make_artifacts(tmp_path / "artifacts", LoraConfig(r=2, alpha=4, targets=["0.weight"]))
    return trained(tmp_path / "artifacts", steps=1)


def builder_folder(folder: Path, module, filename: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    module.export_model_for_inferencing(folder / "model.onnx", ["logits"])
    config = {"model": {"decoder": {"filename": filename}}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_export_writes_the_model_the_config_names_with_the_copied_files(tmp_path, trained_module):
    built = builder_folder(tmp_path / "built", trained_module, "model.onnx")
    adapter = export_for_genai(trained_module, built, tmp_path / "out")
    assert adapter == tmp_path / "out" / "adapter.onnx_adapter" and adapter.is_file()
    assert {path.name for path in (tmp_path / "out").iterdir()} == {
        "adapter.onnx_adapter",
        "genai_config.json",
        "model.onnx",
        "tokenizer.json",
    }


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_a_model_file_name_leaving_the_output_folder_is_refused(tmp_path, trained_module, how):
    victim = tmp_path / "outside" / "victim.onnx"
    victim.parent.mkdir()
    victim.write_bytes(VICTIM)
    filename = "../outside/victim.onnx" if how == "dotdot" else str(victim)
    built = builder_folder(tmp_path / "built", trained_module, filename)
    with pytest.raises(PathOutsideError, match=r"model\.decoder\.filename .*victim\.onnx"):
        export_for_genai(trained_module, built, tmp_path / "out")
    assert victim.read_bytes() == VICTIM


def test_a_symlink_in_the_output_folder_is_not_written_through(tmp_path, trained_module):
    victim = tmp_path / "victim.onnx"
    victim.write_bytes(VICTIM)
    built = builder_folder(tmp_path / "built", trained_module, "model.onnx")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.onnx").symlink_to(victim)
    with pytest.raises(PathOutsideError, match="symbolic link"):
        export_for_genai(trained_module, built, tmp_path / "out")
    assert victim.read_bytes() == VICTIM
    (tmp_path / "out" / "model.onnx").unlink()
    (tmp_path / "out" / "tokenizer.json").symlink_to(victim)  # a copied file's name
    with pytest.raises(PathOutsideError, match="tokenizer.json"):
        export_for_genai(trained_module, built, tmp_path / "out")
    assert victim.read_bytes() == VICTIM


def test_the_base_model_s_own_folder_and_a_dotted_adapter_name_are_refused(tmp_path, trained_module):
    built = builder_folder(tmp_path / "built", trained_module, "model.onnx")
    before = (built / "model.onnx").read_bytes()
    with pytest.raises(ValueError, match="out_dir .* is built_dir"):
        export_for_genai(trained_module, built, tmp_path / "built" / ".")
    assert (built / "model.onnx").read_bytes() == before
    for name in ("..", ".", "a/b", ""):
        with pytest.raises(ValueError, match="adapter_name: expected a plain file name"):
            export_for_genai(trained_module, built, tmp_path / "out", adapter_name=name)
