"""``export_for_genai``: a folder onnxruntime-genai serves, made from a LoRA-trained builder model.

The folder holds the unmerged model (adapters as rank-0 overridable inputs, so that it alone is the base
model) under the file name the builder's ``genai_config.json`` gives, the builder's config and tokenizer
files, and the trained adapters as an ``.onnx_adapter`` file that ``og.Adapters`` loads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx

from ort_torch_train.errors import ModelError
from ort_torch_train.fileio import atomic_write, path_inside
from ort_torch_train.lora.export import LoraModule, export_adapter, export_unmerged_model

GENAI_CONFIG = "genai_config.json"


def export_for_genai(
    module: LoraModule,
    built_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    adapter_name: str = "adapter",
    accuracy_level: int | None = None,
) -> Path:
    """Write ``out_dir`` for onnxruntime-genai; returns the adapter file's path.

    ``built_dir`` is the model builder's output folder the module was trained from: its model's outputs
    (logits and present key/values) and its inputs become the unmerged model's, its other files are copied.
    ``accuracy_level`` sets the int4 (MatMulNBits) products' accuracy level: None keeps the builder's (4 on
    the CPU: int8 activations, the served logits then differ from training's), 0 computes them in float as
    training does (docs/lora.md).
    """
    source, target = Path(os.fspath(built_dir)), Path(os.fspath(out_dir))
    config_path = source / GENAI_CONFIG
    if not config_path.is_file():
        raise FileNotFoundError(f"built_dir {str(source)!r} has no {GENAI_CONFIG}: expected a model builder's output")
    try:
        filename = json.loads(config_path.read_text())["model"]["decoder"]["filename"]
    except (KeyError, TypeError, ValueError) as error:
        raise ModelError(f"{config_path}: expected model.decoder.filename in the genai config ({error})") from None
    if not isinstance(adapter_name, str) or adapter_name in ("", ".", "..") or Path(adapter_name).name != adapter_name:
        raise ValueError(f"adapter_name: expected a plain file name, got {adapter_name!r}")
    key = f"{config_path}: model.decoder.filename"
    model_path = path_inside(source, filename, key)
    if target.exists() and os.path.samefile(source, target):
        raise ValueError(
            f"out_dir {str(target)!r} is built_dir {str(source)!r}: the export would replace the base model; "
            "choose another folder"
        )
    built_model = onnx.load(str(model_path), load_external_data=False)
    outputs = [value.name for value in built_model.graph.output]
    target.mkdir(parents=True, exist_ok=True)
    unmerged = path_inside(target, filename, key)
    adapter = path_inside(target, f"{adapter_name}.onnx_adapter", "adapter_name")
    model_files = {filename, f"{filename}.data", *_external_files(built_model)}
    for entry in sorted(source.iterdir()):
        if entry.is_file() and entry.name not in model_files:
            _copy(entry, path_inside(target, entry.name, f"{str(source)!r}'s file"))
    export_unmerged_model(module, unmerged, outputs, accuracy_level=accuracy_level)
    export_adapter(module, adapter)
    return adapter


def _copy(source: Path, target: Path) -> None:
    with open(source, "rb") as original:
        atomic_write(target, lambda file: shutil.copyfileobj(original, file))


def _external_files(model: onnx.ModelProto) -> set[str]:
    """The files the model's external initializers name."""
    files = set()
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                files.add(entry.value)
    return files
