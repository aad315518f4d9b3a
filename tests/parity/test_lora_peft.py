"""LoRA here against PEFT in plain PyTorch: the same tiny transformers, 10 AdamW steps, same data."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.lora import LoraConfig
from tests.helpers.lora_models import TARGETS, batches, lora_artifacts

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow

STEPS, LR, RANK, ALPHA = 10, 0.01, 4, 8


def peft_name(ours: str) -> str:
    """PEFT's parameter name for one of our adapters ('model.X.lora_A.weight' -> 'base_model.model.X.lora_A.default.weight')."""
    stem, kind, _ = ours[len("model.") :].rsplit(".", 2)
    return f"base_model.model.{stem}.{kind}.default.weight"


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_lora_training_matches_peft(kind: str, tmp_path) -> None:
    patterns, modules = TARGETS[kind]
    model = lora_artifacts(kind, tmp_path, LoraConfig(r=RANK, alpha=ALPHA, targets=patterns))
    reference = peft.get_peft_model(
        copy.deepcopy(model.model),
        peft.LoraConfig(
            r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=modules, fan_in_fan_out=kind == "gpt2"
        ),
    )
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(LR)

    adapters = module.trainable_parameter_names
    reference_params = dict(reference.named_parameters())
    assert sorted(peft_name(name) for name in adapters) == sorted(
        name for name, param in reference_params.items() if param.requires_grad
    )
    with torch.no_grad():  # our A, drawn as PEFT draws it, into PEFT's model; B starts at zero in both
        for name in adapters:
            ours = state.training_state.params[name]
            if ".lora_B" in name:
                assert not ours.any() and not reference_params[peft_name(name)].any()
            reference_params[peft_name(name)].copy_(ours.t())
    frozen_before = {name: state.training_state.params[name].clone() for name in state.training_state.frozen_names()}
    torch_optimizer = torch.optim.AdamW(
        [p for p in reference.parameters() if p.requires_grad], lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
    )

    for tokens, labels in batches(STEPS):
        loss = module(tokens, labels)
        optimizer.step()
        module.lazy_reset_grad()
        reference_loss = F.cross_entropy(
            reference(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.flatten(0, 1), labels
        )
        reference_loss.backward()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
        assert float(loss) == pytest.approx(reference_loss.item(), abs=1e-5)

    for name in adapters:
        torch.testing.assert_close(
            state.training_state.params[name].detach(),
            reference_params[peft_name(name)].detach().t(),
            rtol=0,
            atol=1e-5,
        )
        assert state.training_state.params[name].abs().sum() > 0  # trained: A and B moved
    for name, before in frozen_before.items():
        assert torch.equal(state.training_state.params[name], before), name
