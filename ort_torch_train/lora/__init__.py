"""LoRA fine-tuning of ONNX training artifacts: low-rank adapters beside the targeted weight matrices.

``generate_artifacts(..., lora=LoraConfig(...))`` writes artifacts whose only trainable parameters
are the adapters; ``Module(..., lora=LoraConfig(...))`` adds them to existing artifacts. Exports:
``export_model_for_inferencing`` merges them; ``ort_torch_train.lora.export`` writes an unmerged
model and ``.onnx_adapter`` files for onnxruntime; ``export_peft`` and ``LoraConfig.from_peft`` +
``load_peft_weights`` exchange adapters with PEFT. See docs/lora.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ort_torch_train.lora.apply import add_lora_to_artifacts, add_lora_to_base
    from ort_torch_train.lora.config import ALL_LINEAR, LORA_PROPERTY, LoraConfig
    from ort_torch_train.lora.insert import adapter_names
    from ort_torch_train.lora.peft import export_peft, load_peft_weights
    from ort_torch_train.lora.record import LoraRecord, LoraTarget, read_record

# each export -> its module, imported at first use: reading a LoRA record or config needs no torch
_EXPORTS = {
    "ALL_LINEAR": "config",
    "LORA_PROPERTY": "config",
    "LoraConfig": "config",
    "LoraRecord": "record",
    "LoraTarget": "record",
    "adapter_names": "insert",
    "add_lora_to_artifacts": "apply",
    "add_lora_to_base": "apply",
    "export_peft": "peft",
    "load_peft_weights": "peft",
    "read_record": "record",
}
__all__ = [
    "ALL_LINEAR",
    "LORA_PROPERTY",
    "LoraConfig",
    "LoraRecord",
    "LoraTarget",
    "adapter_names",
    "add_lora_to_artifacts",
    "add_lora_to_base",
    "export_peft",
    "load_peft_weights",
    "read_record",
]


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
