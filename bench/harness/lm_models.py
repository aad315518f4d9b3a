"""Token models for the benchmarks: a hand-written GPT-style decoder and tiny ``transformers`` models.

Every model takes int64 token ids (batch, tokens) and returns 2-D logits: (batch * tokens, vocab) for
the language models, (batch, classes) for BERT, so CrossEntropyLoss applies as is. ``transformers`` is
imported only when one of its models is built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DecoderBlock(nn.Module):
    """Pre-LN block: causal multi-head self-attention (F.scaled_dot_product_attention), then a GELU MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.projection = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.shape[-1]
        q, k, v = (
            t.unflatten(-1, (self.heads, hidden // self.heads)).transpose(1, 2)
            for t in self.qkv(self.attention_norm(x)).split(hidden, dim=-1)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).flatten(2))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """GPT-style language model: token + learned position embeddings, pre-LN blocks, final LayerNorm, LM head."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, tokens: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.positions = nn.Parameter(torch.randn(tokens, hidden) * 0.02)
        self.blocks = nn.Sequential(*(DecoderBlock(hidden, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.positions
        return self.head(self.norm(self.blocks(x))).flatten(0, 1)


class TransformersLogits(nn.Module):
    """A ``transformers`` model returning its logits tensor only, flattened to 2-D (exporters need tensors)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # an explicit all-ones mask: without one, transformers looks for packed sequences with aten::diff,
        # which the legacy exporter cannot export
        logits = self.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
        return logits.flatten(0, 1) if logits.dim() == 3 else logits


def tiny_transformer(
    kind: str, vocab: int, hidden: int = 32, layers: int = 2, heads: int = 2, classes: int = 4, tokens: int = 8
) -> nn.Module:
    """A random-init ``transformers`` gpt2, llama (causal LMs) or bert (sequence classifier) from a config."""
    import transformers

    common = {"vocab_size": vocab, "attn_implementation": "eager"}
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=tokens,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,
            bos_token_id=0,
            eos_token_id=0,
            **common,
        )
        return TransformersLogits(transformers.GPT2LMHeadModel(config))
    if kind == "llama":
        config = transformers.LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=tokens,
            use_cache=False,
            **common,
        )
        return TransformersLogits(transformers.LlamaForCausalLM(config))
    if kind == "bert":
        config = transformers.BertConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=2 * hidden,
            max_position_embeddings=tokens,
            num_labels=classes,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            **common,
        )
        return TransformersLogits(transformers.BertForSequenceClassification(config))
    raise ValueError(f"unknown transformers model {kind!r}; expected gpt2, llama or bert")
