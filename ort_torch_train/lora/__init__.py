"""LoRA fine-tuning of ONNX training artifacts: low-rank adapters beside the targeted weight matrices.

``generate_artifacts(..., lora=LoraConfig(...))`` writes artifacts whose only trainable parameters
are the adapters; ``Module(..., lora=LoraConfig(...))`` adds them to existing artifacts. Exports:
``export_model_for_inferencing`` merges them; ``ort_torch_train.lora.export`` writes an unmerged
model and ``.onnx_adapter`` files for onnxruntime; ``export_peft`` and ``LoraConfig.from_peft`` +
``load_peft_weights`` exchange adapters with PEFT. See docs/lora.md.
"""

from ort_torch_train.lora.apply import add_lora_to_artifacts, add_lora_to_base
from ort_torch_train.lora.config import ALL_LINEAR, LORA_PROPERTY, LoraConfig
from ort_torch_train.lora.insert import adapter_names
from ort_torch_train.lora.peft import export_peft, load_peft_weights
from ort_torch_train.lora.record import LoraRecord, LoraTarget, read_record

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
