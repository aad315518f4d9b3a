"""Tiny random-init ``transformers`` causal LMs for the LoRA tests, with their artifacts (no tests here)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ort_torch_train.artifacts import AdamW, LossType, generate_artifacts
from ort_torch_train.lora import LoraConfig

VOCAB, TOKENS, BATCH = 48, 8, 2
# each model's LoRA targets: (our patterns over initializer names, PEFT's target_modules)
TARGETS = {
    "llama": (["*q_proj.weight", "*v_proj.weight", "*down_proj.weight"], ["q_proj", "v_proj", "down_proj"]),
    "gpt2": (["*c_attn.weight", "*c_proj.weight", "*c_fc.weight"], ["c_attn", "c_proj", "c_fc"]),
}


class Logits(nn.Module):
    """A ``transformers`` LM returning 2-D logits (batch * tokens, vocab), so CrossEntropyLoss applies."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.flatten(0, 1)


def tiny_lm(kind: str, seed: int = 0) -> Logits:
    """A 1-layer gpt2 or llama with hidden size 16, random weights from ``seed``."""
    import transformers

    torch.manual_seed(seed)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=TOKENS, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation="eager",
        )  # fmt: skip
        return Logits(transformers.GPT2LMHeadModel(config))
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=TOKENS, use_cache=False, attn_implementation="eager",
    )  # fmt: skip
    return Logits(transformers.LlamaForCausalLM(config))


def lora_artifacts(kind: str, directory: Path, lora: LoraConfig, model: nn.Module | None = None) -> Logits | nn.Module:
    """Write LoRA artifacts of ``tiny_lm(kind)`` (CrossEntropy, AdamW in torch.optim.AdamW's mode) to ``directory``."""
    model = model if model is not None else tiny_lm(kind)
    generate_artifacts(
        model,
        example_inputs=(torch.zeros(BATCH, TOKENS, dtype=torch.int64),),
        input_names=["tokens"],
        output_names=["logits"],
        loss=LossType.CrossEntropyLoss,
        optimizer=AdamW(eps=1e-8, weight_decay=0.01, adam_mode=0),
        artifact_directory=directory,
        lora=lora,
    )
    return model


def batches(steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens, labels) pairs: random tokens, the next-token labels flattened."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (BATCH, TOKENS + 1), generator=generator)
        found.append((tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1).contiguous()))
    return found
