"""The benchmark models: torch definitions, batch shapes and seeded data (torch + numpy only).

Both virtualenvs import this file: the ORT venv exports and generates artifacts from it, the workers
build the hand-written eager baseline from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from lm_models import Decoder, tiny_transformer
from torch import nn

OPSET = 17
LEARNING_RATE = 1e-3
ADAMW_EPS = 1e-6  # onnxblock AdamW defaults: adam_mode 1, bias correction, weight decay 0
WEIGHT_SEED = 0
DATA_SEED = 1234


class PooledEncoder(nn.Module):
    """TransformerEncoder (post-LN, batch_first; ReLU and no dropout by default) + mean over tokens + Linear head."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int,
        layers: int,
        classes: int,
        activation: str = "relu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward, dropout=dropout, activation=activation, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


class LastStepRecurrent(nn.Module):
    """A batch-first GRU or LSTM + Linear head on the last time step's output."""

    def __init__(
        self, kind: type[nn.GRU] | type[nn.LSTM], features: int, hidden: int, classes: int, bidirectional: bool = False
    ) -> None:
        super().__init__()
        self.rnn = kind(features, hidden, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


@dataclass(frozen=True)
class BenchModel:
    """One benchmark model: how to build it, its batch, and default step counts per round."""

    name: str
    description: str
    build_module: Callable[[], nn.Module]
    example_shape: tuple[int, ...]  # one example, without the batch dimension
    batch: int
    classes: int
    steps: int  # timed steps per round by default
    warmup: int
    vocab: int = 0  # > 0: fed token ids below ``vocab``
    language_model: bool = False  # one label per token (the next one), ``classes`` == ``vocab``

    def build(self) -> nn.Module:
        """The model with seeded weights, in training mode (the same weights in every process)."""
        torch.manual_seed(WEIGHT_SEED)
        return self.build_module().train()

    def batch_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The fixed batch every step trains on: x float32 (int64 token ids with ``vocab``), y int64 per
        example (per token, the next one, flattened to batch x tokens for a language model)."""
        rng = np.random.default_rng(DATA_SEED)
        if self.language_model:
            tokens = rng.integers(0, self.vocab, size=(self.batch, self.example_shape[0] + 1)).astype(np.int64)
            return tokens[:, :-1].copy(), tokens[:, 1:].reshape(-1).copy()
        if self.vocab:
            x = rng.integers(0, self.vocab, size=(self.batch, *self.example_shape)).astype(np.int64)
        else:
            x = rng.standard_normal((self.batch, *self.example_shape)).astype(np.float32)
        y = rng.integers(0, self.classes, size=self.batch).astype(np.int64)
        return x, y

    def describe(self) -> dict:
        """What defines the benchmark (for reports and the artifact cache key)."""
        return {
            "name": self.name,
            "description": self.description,
            "input": [self.batch, *self.example_shape],
            "classes": self.classes,
            "loss": "CrossEntropyLoss (mean)",
            "optimizer": f"AdamW (onnxblock: adam_mode 1, eps {ADAMW_EPS}, weight_decay 0), lr {LEARNING_RATE}",
            "export": f"torch.onnx.export legacy, opset {OPSET}, TrainingMode.TRAINING, no constant folding",
        }


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(100, 10))


def _tinyformer() -> nn.Module:
    return PooledEncoder(d_model=16, nhead=2, dim_feedforward=32, layers=1, classes=4)


def _encoder() -> nn.Module:
    return PooledEncoder(d_model=256, nhead=4, dim_feedforward=1024, layers=4, classes=4)


def _gru() -> nn.Module:
    return LastStepRecurrent(nn.GRU, 16, 32, 4)


def _lstm() -> nn.Module:
    return LastStepRecurrent(nn.LSTM, 16, 32, 4)  # forward: ORT 1.19.2 trains no bidirectional LSTM


def _encoder_gelu_dropout() -> nn.Module:
    return PooledEncoder(
        d_model=256, nhead=4, dim_feedforward=1024, layers=4, classes=4, activation="gelu", dropout=0.1
    )


# the encoder with GELU and dropout, for the legacy recompute settings (bench_recompute.py); not in MODELS
ENCODER_GELU_DROPOUT = BenchModel(
    "encoder_gelu_dropout",
    "TransformerEncoder(4 layers, d256, 4 heads, ff 1024, GELU, dropout 0.1) + mean-pool + Linear(256,4)",
    _encoder_gelu_dropout,
    (128, 256),
    16,
    4,
    steps=4,
    warmup=3,
)


def _decoder(hidden: int) -> Callable[[], nn.Module]:
    return lambda: Decoder(vocab=DECODER_VOCAB, hidden=hidden, heads=4, layers=2, tokens=DECODER_TOKENS)


def _transformer(kind: str) -> Callable[[], nn.Module]:
    return lambda: tiny_transformer(kind, vocab=TINY_VOCAB, classes=4, tokens=TINY_TOKENS)


DECODER_VOCAB, DECODER_TOKENS = 512, 32
TINY_VOCAB, TINY_TOKENS = 256, 8
DECODER_SIZES = {32: (200, 20), 128: (60, 10), 512: (8, 3), 1024: (4, 2)}  # hidden: (steps, warmup)
GPT2_SMALL_VOCAB, GPT2_SMALL_TOKENS = 50257, 128


def _gpt2_small() -> nn.Module:
    return tiny_transformer("gpt2", vocab=GPT2_SMALL_VOCAB, hidden=768, layers=12, heads=12, tokens=GPT2_SMALL_TOKENS)


# GPT-2 small's shape (124M parameters) at batch 2 x 128 tokens, for bench/experiments/scale.py; not in MODELS' defaults
GPT2_SMALL = BenchModel(
    "gpt2-124m",
    f"transformers gpt2, GPT-2 small's shape (random init, hidden 768, 12 layers, 12 heads, vocab {GPT2_SMALL_VOCAB}), "
    f"LM loss on 2 x {GPT2_SMALL_TOKENS} tokens",
    _gpt2_small,
    (GPT2_SMALL_TOKENS,),
    2,
    GPT2_SMALL_VOCAB,
    steps=3,
    warmup=2,
    vocab=GPT2_SMALL_VOCAB,
    language_model=True,
)

DEFAULT_MODELS = ("mlp", "cnn", "tinyformer", "encoder", "gru", "lstm")

MODELS: dict[str, BenchModel] = {
    m.name: m
    for m in [
        BenchModel("mlp", "Linear(20,32)-ReLU-Linear(32,5)", _mlp, (20,), 64, 5, steps=1000, warmup=100),
        BenchModel(
            "cnn",
            "Conv2d(1,4,3)-ReLU-MaxPool2d(2)-Flatten-Linear(100,10)",
            _cnn,
            (1, 12, 12),
            64,
            10,
            steps=500,
            warmup=50,
        ),
        BenchModel(
            "tinyformer",
            "TransformerEncoderLayer(d16, 2 heads, ff 32) + mean-pool + Linear(16,4)",
            _tinyformer,
            (12, 16),
            16,
            4,
            steps=300,
            warmup=30,
        ),
        BenchModel(
            "encoder",
            "TransformerEncoder(4 layers, d256, 4 heads, ff 1024) + mean-pool + Linear(256,4)",
            _encoder,
            (128, 256),
            16,
            4,
            steps=4,
            warmup=3,
        ),
        BenchModel(
            "gru", "GRU(16,32) over 20 steps + last step + Linear(32,4)", _gru, (20, 16), 32, 4, steps=200, warmup=20
        ),
        BenchModel(
            "lstm", "LSTM(16,32) over 20 steps + last step + Linear(32,4)", _lstm, (20, 16), 32, 4, steps=200, warmup=20
        ),
        *(
            BenchModel(
                f"gpt{hidden}",
                f"GPT-style decoder (2 pre-LN layers, hidden {hidden}, 4 heads, causal SDPA, GELU MLP, "
                f"vocab {DECODER_VOCAB}), LM loss on 8 x {DECODER_TOKENS} tokens",
                _decoder(hidden),
                (DECODER_TOKENS,),
                8,
                DECODER_VOCAB,
                steps=steps,
                warmup=warmup,
                vocab=DECODER_VOCAB,
                language_model=True,
            )
            for hidden, (steps, warmup) in DECODER_SIZES.items()
        ),
        *(
            BenchModel(
                f"tiny-{kind}",
                f"transformers {kind} (random init, hidden 32, 2 layers, 2 heads, vocab {TINY_VOCAB}"
                f"{', LM loss' if kind != 'bert' else ', 4 classes'}), 4 x {TINY_TOKENS} tokens",
                _transformer(kind),
                (TINY_TOKENS,),
                4,
                TINY_VOCAB if kind != "bert" else 4,
                steps=200,
                warmup=20,
                vocab=TINY_VOCAB,
                language_model=kind != "bert",
            )
            for kind in ("gpt2", "llama", "bert")
        ),
        GPT2_SMALL,
    ]
}
