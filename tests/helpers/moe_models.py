"""Tiny random-init ``transformers`` models whose graphs hold data-dependent sizes: Mixture-of-Experts
language models (tokens routed to each expert through NonZero/Where, Gather and index_add) and DINOv2
(a bicubic Resize of its position embeddings). Built from configs, offline."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 32


class Logits(nn.Module):
    """A ``transformers`` causal LM returning its logits only, flattened to (batch * tokens, vocab)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # an explicit all-ones mask: without one, transformers looks for packed sequences (aten::diff)
        return self.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.flatten(0, 1)


def route_over_every_expert(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """The experts of transformers' Mixtral/OLMoE, with the loop over every expert (as transformers 4
    wrote it) instead of over those a batch reaches: exported, an expert no token reaches is a NonZero
    of size 0 in the graph, not a loop the export unrolled for the example's experts."""
    final = torch.zeros_like(hidden_states)
    expert_mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
    for expert in range(self.num_experts):
        position, token = torch.where(expert_mask[expert])
        gate, up = nn.functional.linear(hidden_states[token], self.gate_up_proj[expert]).chunk(2, dim=-1)
        routed = nn.functional.linear(self.act_fn(gate) * up, self.down_proj[expert])
        final.index_add_(0, token, routed * top_k_weights[token, position, None])
    return final


def tiny_moe(kind: str, every_expert: bool = False, experts: int = 4) -> nn.Module:
    """A one-layer ``mixtral``, ``olmoe`` or ``qwen2_moe`` (with its shared expert) LM (hidden 32, ``experts``
    experts, 2 per token), seeded;
    ``every_expert``: its experts loop over every expert (``route_over_every_expert``)."""
    import transformers

    torch.manual_seed(0)
    common = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
        "num_experts_per_tok": 2,
        "use_cache": False,
        "attn_implementation": "eager",
        "experts_implementation": "eager",
    }
    if kind == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=experts, **common))
    elif kind == "olmoe":
        model = transformers.OlmoeForCausalLM(transformers.OlmoeConfig(num_experts=experts, **common))
    elif kind == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(
            num_experts=experts, moe_intermediate_size=32, shared_expert_intermediate_size=32, **common
        )
        model = transformers.Qwen2MoeForCausalLM(config)
    else:
        raise ValueError(f"unknown MoE model {kind!r}; expected mixtral, olmoe or qwen2_moe")
    if every_expert:
        experts = model.model.layers[0].mlp.experts
        experts.forward = route_over_every_expert.__get__(experts)
    return Logits(model)


def experts_reached(model: nn.Module, tokens: torch.Tensor) -> set[int]:
    """The experts of the first layer of a ``tiny_moe`` model that some token of ``tokens`` reaches."""
    reached: set[int] = set()
    experts = model.model.model.layers[0].mlp.experts

    def record(module, args):
        reached.update(int(e) for e in args[1].unique())

    handle = experts.register_forward_pre_hook(record)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    return reached


class Dinov2Logits(nn.Module):
    """A one-layer ``transformers`` DINOv2 classifier (hidden 32, 16x16 images in 4x4 patches), seeded."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        torch.manual_seed(0)
        config = transformers.Dinov2Config(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=16,
            patch_size=4,
            num_labels=3,
            attn_implementation="eager",
        )
        self.model = transformers.Dinov2ForImageClassification(config)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels).logits
