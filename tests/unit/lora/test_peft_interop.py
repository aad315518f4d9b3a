"""LoRA adapters exchanged with PEFT both ways, on a tiny transformers llama and gpt2: ours exported with
``export_peft`` load with ``peft.PeftModel.from_pretrained`` onto the source model, and a PEFT adapter
loads here with ``LoraConfig.from_peft`` + ``load_peft_weights`` and trains on; logits within 1e-5."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.peft import export_peft, load_peft_weights
from tests.helpers.lora_models import TARGETS, batches, lora_artifacts

peft = pytest.importorskip("peft")
ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.slow

PREFIX = "model."  # tests.helpers.lora_models.Logits holds the transformers model as .model


def onnx_logits(module: Module, path, tokens: torch.Tensor) -> np.ndarray:
    module.export_model_for_inferencing(path, ["logits"])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"tokens": tokens.numpy()})[0]


def peft_logits(model: torch.nn.Module, tokens: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.flatten(0, 1).numpy()


def train(module: Module, directory, steps: int) -> list[float]:
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.05)
    losses = []
    for tokens, labels in batches(1, seed=3) * steps:  # one batch: its loss goes down
        losses.append(float(module(tokens, labels)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_export_peft_loads_in_peft_with_the_same_logits(kind, tmp_path) -> None:
    patterns, _ = TARGETS[kind]
    model = lora_artifacts(kind, tmp_path, LoraConfig(r=4, alpha=8, targets=patterns))
    module = Module(
        tmp_path / "training_model.onnx",
        CheckpointState.load_checkpoint(tmp_path / "checkpoint"),
        tmp_path / "eval_model.onnx",
    )
    train(module, tmp_path, 3)  # B moves away from zero
    export_peft(module, tmp_path / "adapter", module_prefix=PREFIX)
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(model.model), tmp_path / "adapter").eval()
    tokens = batches(1, seed=9)[0][0]
    ours, theirs = onnx_logits(module, tmp_path / "inference.onnx", tokens), peft_logits(loaded, tokens)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    base = peft_logits(model.model, tokens)
    assert np.abs(theirs - base).max() > 1e-3  # the adapter changes the logits


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_peft_adapter_loads_and_trains_on(kind, tmp_path) -> None:
    _, modules = TARGETS[kind]
    model = lora_artifacts(kind, tmp_path, None)  # plain artifacts of the source model
    torch.manual_seed(5)
    config = peft.LoraConfig(
        r=4, lora_alpha=16, target_modules=modules, fan_in_fan_out=kind == "gpt2", init_lora_weights=False
    )  # random B: the adapter is not the identity
    peft_model = peft.get_peft_model(copy.deepcopy(model.model), config).eval()
    peft_model.save_pretrained(tmp_path / "adapter")

    lora = LoraConfig.from_peft(tmp_path / "adapter")
    assert (lora.r, lora.alpha) == (4, 16.0)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx", lora=lora)
    load_peft_weights(module, tmp_path / "adapter", module_prefix=PREFIX)
    tokens = batches(1, seed=9)[0][0]
    np.testing.assert_allclose(
        onnx_logits(module, tmp_path / "inference.onnx", tokens), peft_logits(peft_model, tokens), rtol=0, atol=1e-5
    )
    adapters = {name: state.training_state.params[name].detach().clone() for name in module.trainable_parameter_names}
    losses = train(module, tmp_path, 3)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert all(not torch.equal(state.training_state.params[name], before) for name, before in adapters.items())
