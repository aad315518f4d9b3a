"""LoRA adapters exchanged with PEFT: a PEFT adapter folder (``adapter_config.json`` and
``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained`` loads onto the source model,
and a PEFT adapter's weights loaded into a Module built with ``LoraConfig.from_peft(folder)``.

PEFT keeps ``lora_A.weight`` as (r, in) and ``lora_B.weight`` as (out, r), under
``base_model.model.<module path>``; here A is (in, r) and B is (r, out), both unscaled, with the same
``alpha / r`` applied in the graph. A target weight ``<prefix><module path>.weight`` maps to the
module path; ``module_prefix`` is what the exported torch module put before the source model's own
paths (``"model."`` when the exported module held the transformers model as ``self.model``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from ort_torch_train.errors import ModelError
from ort_torch_train.fileio import atomic_write_bytes
from ort_torch_train.lora.config import LORA_PROPERTY, LoraConfig
from ort_torch_train.lora.export import LoraModule, _record
from ort_torch_train.lora.record import LoraTarget

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_ROOT = "base_model.model."


def export_peft(
    module: LoraModule, directory: str | os.PathLike, module_prefix: str = "", base_model: str | None = None
) -> Path:
    """Write the module's adapters as a PEFT LoRA adapter folder; ``base_model``: the source model's
    name or path recorded in the config (``base_model_name_or_path``). Returns the folder."""
    record = _record(module)
    params = module.training_state.params
    weights: dict[str, torch.Tensor] = {}
    transposed = {target.transposed for target in record.targets}
    if len(transposed) > 1:
        raise ModelError("the adapted weights mix (out, in) and (in, out) layouts: PEFT takes one fan_in_fan_out")
    for target in record.targets:
        path = module_path(target, module_prefix)
        weights[f"{PEFT_ROOT}{path}.lora_A.weight"] = params[target.lora_a].detach().float().t().contiguous().cpu()
        weights[f"{PEFT_ROOT}{path}.lora_B.weight"] = params[target.lora_b].detach().float().t().contiguous().cpu()
    properties = module.training_state.properties
    dropout = LoraConfig.from_json(str(properties[LORA_PROPERTY])).dropout if LORA_PROPERTY in properties else 0.0
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base_model,
        "r": record.rank,
        "lora_alpha": record.alpha,
        "lora_dropout": dropout,
        "target_modules": sorted({module_path(target, module_prefix) for target in record.targets}),
        "fan_in_fan_out": not transposed.pop(),
        "bias": "none",
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "task_type": None,
    }
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / WEIGHTS_FILE, save(weights, metadata={"format": "pt"}))
    atomic_write_bytes(folder / CONFIG_FILE, (json.dumps(config, indent=2) + "\n").encode())
    return folder


def load_peft_weights(module: LoraModule, directory: str | os.PathLike, module_prefix: str = "") -> None:
    """Set the module's adapters (built with ``LoraConfig.from_peft(directory)``) from the PEFT
    adapter's ``adapter_model.safetensors``."""
    file = Path(directory) / WEIGHTS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"not a PEFT adapter folder: {os.fspath(file)!r} not found")
    tensors = {name.replace(".default.", "."): value for name, value in load_file(file).items()}
    record = _record(module)
    params = module.training_state.params
    expected = {}
    for target in record.targets:
        path = module_path(target, module_prefix)
        expected[f"{PEFT_ROOT}{path}.lora_A.weight"] = (target.lora_a, (record.rank, target.in_features))
        expected[f"{PEFT_ROOT}{path}.lora_B.weight"] = (target.lora_b, (target.out_features, record.rank))
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ModelError(
            f"{os.fspath(file)!r} does not fit the module's adapters: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]} (module_prefix={module_prefix!r}: the prefix of the weight names before the PEFT "
            "model's module paths)"
        )
    for key, (_, shape) in expected.items():
        if not tensors[key].dtype.is_floating_point:
            raise ModelError(
                f"{os.fspath(file)!r}: {key!r} holds {str(tensors[key].dtype).removeprefix('torch.')} values, "
                "expected floating-point adapter weights"
            )
        if tuple(tensors[key].shape) != shape:
            raise ModelError(
                f"{os.fspath(file)!r}: {key!r} is {list(tensors[key].shape)}, the module expects {list(shape)}"
            )
    with torch.no_grad():
        for key, (name, _) in expected.items():
            params[name].copy_(tensors[key].t())


def module_path(target: LoraTarget, module_prefix: str) -> str:
    """The source model's module path of an adapted weight (its name without prefix and ``.weight``)."""
    name = target.weight
    if not name.startswith(module_prefix) or not name.endswith(".weight") or name.endswith(".MatMul.weight"):
        raise ModelError(
            f"weight {name!r} names no torch module{f' under the prefix {module_prefix!r}' if module_prefix else ''}: "
            "PEFT adapters need artifacts exported from the torch model with its parameter names"
        )
    return name[len(module_prefix) : -len(".weight")]
