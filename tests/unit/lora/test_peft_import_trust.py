"""A PEFT adapter folder is untrusted input: a fractional rank, an infinite alpha, a malformed
``adapter_config.json`` and integer or boolean adapter tensors are each refused by name."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from ort_torch_train.errors import ModelError
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.peft import load_peft_weights
from tests.unit.lora.helpers import make_artifacts, trained

GOOD = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "lora_dropout": 0.0, "target_modules": ["0"]}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({**GOOD, "r": 2.7}, r"r: expected an integer rank > 0, got 2\.7"),
        ({**GOOD, "r": True}, r"r: expected an integer rank > 0, got True"),
        ({**GOOD, "lora_alpha": math.inf}, r"lora_alpha: expected a finite number, got inf"),
        ({**GOOD, "lora_alpha": -1}, r"LoraConfig.alpha: expected a finite number > 0, got -1"),
        ({**GOOD, "lora_dropout": "0.1"}, r"lora_dropout: expected a finite number, got '0.1'"),
        ({key: value for key, value in GOOD.items() if key != "r"}, r"r: expected an integer rank > 0, got None"),
        ({**GOOD, "target_modules": [1]}, r"target_modules: expected module names, got \[1\]"),
        ([GOOD], r"expected a JSON object, got list"),
    ],
)
def test_a_malformed_adapter_config_is_refused_by_name(tmp_path, config, expected) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=expected) as refused:
        LoraConfig.from_peft(tmp_path)
    assert "adapter_config.json" in str(refused.value)


def test_the_api_refuses_an_infinite_alpha() -> None:
    with pytest.raises(ValueError, match="LoraConfig.alpha: expected a finite number > 0, got inf"):
        LoraConfig(r=2, alpha=math.inf)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_integer_or_boolean_adapter_tensors_are_refused(tmp_path, dtype) -> None:
    make_artifacts(tmp_path / "artifacts", LoraConfig(r=2, alpha=4, targets=["0.weight"]))
    module = trained(tmp_path / "artifacts", steps=0)
    before = {name: value.clone() for name, value in module.training_state.params.items()}
    tensors = {
        "base_model.model.0.lora_A.weight": torch.ones(2, 8).to(dtype),
        "base_model.model.0.lora_B.weight": torch.ones(16, 2),
    }
    save_file(tensors, tmp_path / "adapter_model.safetensors")
    with pytest.raises(ModelError, match=rf"'base_model.model.0.lora_A.weight' holds {str(dtype)[6:]} values"):
        load_peft_weights(module, tmp_path)
    for name, value in module.training_state.params.items():
        assert torch.equal(value, before[name]), name
