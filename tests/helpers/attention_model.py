"""A one-block transformer with separate query, key and value projections (BERT's and Llama's layout, as
ORT's Megatron pass matched them), exported to training artifacts laid out as a fixture: the tensor
parallel tests split its attention heads and its MLP pair.

The export computes the reshape to ``[batch, tokens, heads, head_dim]`` in the graph: the heads count a
constant, the head size the hidden size divided by it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

BATCH, TOKENS, CLASSES, STEPS = 4, 6, 4, 6


class Block(nn.Module):
    """Pre-LN self-attention (``heads`` heads), then a ReLU MLP, both residual."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(hidden)
        self.query, self.key, self.value = (
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
        )
        self.output = nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        normed = self.norm(x)
        q, k, v = (
            projection(normed).view(batch, tokens, self.heads, hidden // self.heads).transpose(1, 2)
            for projection in (self.query, self.key, self.value)
        )
        scores = q @ k.transpose(-1, -2) / (hidden // self.heads) ** 0.5
        attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, tokens, hidden)
        x = x + self.output(attended)
        return x + self.fc2(torch.relu(self.fc1(x)))


class Classifier(nn.Module):
    """The block, mean-pooled over tokens, then a linear head."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.block = Block(hidden, heads)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x).mean(1))


def make_attention_fixture(folder: Path, hidden: int = 16, heads: int = 4) -> Path:
    """``folder`` laid out as a fixture (artifacts/ with AdamW, data.npz, expected.json); returns it."""
    from ort_torch_train.artifacts import AdamW, LossType, generate_artifacts

    torch.manual_seed(0)
    generate_artifacts(
        Classifier(hidden, heads),
        example_inputs=(torch.zeros(BATCH, TOKENS, hidden),),
        input_names=["input"],
        output_names=["logits"],
        loss=LossType.CrossEntropyLoss,
        optimizer=AdamW(),
        artifact_directory=folder / "artifacts",
    )
    rng = np.random.default_rng(5)
    np.savez(
        folder / "data.npz",
        x_train=rng.standard_normal((STEPS, BATCH, TOKENS, hidden)).astype(np.float32),
        y_train=rng.integers(0, CLASSES, (STEPS, BATCH)).astype(np.int64),
    )
    (folder / "expected.json").write_text(json.dumps({"data_keys": {"train": ["x_train", "y_train"]}}))
    return folder
