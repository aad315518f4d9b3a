"""A small BERT-style encoder exported for the legacy TrainingSession's recompute tests, and its training on
this rank's share of each batch (tests/unit/legacy/test_legacy_recompute.py, and under ZeRO stages 2 and 3
tests/unit/distributed/test_fully_sharded_compiled.py through tests/helpers/sharding_worker.py)."""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto
from torch import nn

from ort_torch_train.legacy import TrainingParameters, TrainingSession

LR = {"Learning_Rate": np.array([0.01], np.float32)}
STEPS = 3


class BertLayer(nn.Module):
    """A BERT layer: Q/K/V projections, attention dropout, post-LN residuals, GELU feed-forward."""

    def __init__(self, d: int, heads: int, ff: int, p: float, pre_ln: bool):
        super().__init__()
        self.heads, self.pre_ln = heads, pre_ln
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.inter, self.out = nn.Linear(d, ff), nn.Linear(ff, d)
        self.drop = nn.Dropout(p)

    def forward(self, x, bias):
        if self.pre_ln:  # x + attention(ln1(x)), then + feed-forward(ln2(.))
            x = x + self._attention(self.ln1(x), bias)
            return x + self._feed_forward(self.ln2(x))
        x = self.ln1(x + self._attention(x, bias))
        return self.ln2(x + self._feed_forward(x))

    def _attention(self, x, bias):
        b, t, d = x.shape
        split = lambda z: z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        probs = self.drop((q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias).softmax(-1))
        return self.drop(self.o((probs @ v).transpose(1, 2).reshape(b, t, d)))

    def _feed_forward(self, x):
        return self.drop(self.out(F.gelu(self.inter(x))))


class Bert(nn.Module):
    """``layers`` BERT layers over an input LayerNorm, a mean-pooled linear head and its cross-entropy loss;
    ``dropout`` the probability of every Dropout."""

    def __init__(self, layers: int = 3, d: int = 16, pre_ln: bool = False, dropout: float = 0.1):
        super().__init__()
        self.ln0, self.drop = nn.LayerNorm(d), nn.Dropout(dropout)
        self.layers = nn.ModuleList(BertLayer(d, 2, 32, dropout, pre_ln) for _ in range(layers))
        self.head = nn.Linear(d, 4)

    def forward(self, x, mask, y):
        bias = (1.0 - mask[:, None, None, :]) * -10000.0
        h = self.drop(self.ln0(x))
        for layer in self.layers:
            h = layer(h, bias)
        logits = self.head(h.mean(1))
        return F.cross_entropy(logits, y), logits


def bert_batches(rng: np.random.Generator, batch: int = 4, tokens: int = 6) -> list[dict[str, np.ndarray]]:
    """``STEPS`` feeds of ``Bert``'s inputs, the last token masked out."""
    mask = np.ones((batch, tokens), np.float32)
    mask[:, tokens - 1] = 0
    return [
        {
            "x": rng.standard_normal((batch, tokens, 16)).astype(np.float32),
            "mask": mask,
            "y": rng.integers(0, 4, batch).astype(np.int64),
        }
        for _ in range(STEPS)
    ]


def export_bert(model: nn.Module, path: Path, dynamic_batch: bool = False) -> Path:
    """``model`` exported in training mode (Dropout nodes kept) with its loss as the first output; the batch
    axis fixed, or with ``dynamic_batch`` any size."""
    feeds = bert_batches(np.random.default_rng(0))[0]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model.train(),
            tuple(torch.from_numpy(feeds[k]) for k in ("x", "mask", "y")),
            buffer,
            dynamo=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=["x", "mask", "y"],
            output_names=["loss", "logits"],
            dynamic_axes={name: {0: "batch"} for name in ("x", "mask", "y", "logits")} if dynamic_batch else None,
        )
    path.write_bytes(buffer.getvalue())
    return path


def bert_parameters(
    model: onnx.ModelProto, loss: str, optimizer: str = "AdamOptimizer", **settings: object
) -> TrainingParameters:
    """``optimizer`` on every float weight of ``model``, 2 accumulation steps, and ``settings``."""
    weights = [init.name for init in model.graph.initializer if init.data_type == TensorProto.FLOAT and init.dims]
    p = TrainingParameters()
    p.loss_output_name = loss
    p.training_optimizer_name = optimizer
    p.optimizer_attributes_map = {w: {} for w in weights}
    p.optimizer_int_attributes_map = {w: {} for w in weights}
    p.gradient_accumulation_steps = 2  # the first run's gradients stay in .grad to compare
    for name, value in settings.items():
        setattr(p, name, value)
    return p


def sharded_layers_train(path: Path, rank: int = 0, world_size: int = 1, zero_stage: int = 0) -> dict[str, np.ndarray]:
    """``path`` (a ``Bert`` without dropout, its batch axis dynamic) trained by a legacy session with ``transformer_layer_recompute``
    over ``world_size`` data-parallel ranks at ``deepspeed_zero_stage``, each on its share of every batch, by SGD
    (Adam would turn the key projection's bias gradient, zero but for rounding, into whole steps):
    the losses, the checkpointed regions of the training graph, the sharding units (under stages 2 and 3)
    and the final whole parameters."""
    settings = {"world_rank": rank, "world_size": world_size, "data_parallel_size": world_size}
    session = TrainingSession(
        str(path),
        bert_parameters(
            onnx.load(path),
            "loss",
            "SGDOptimizer",
            deepspeed_zero_stage=zero_stage,
            transformer_layer_recompute=True,
            **settings,
        ),
    )
    losses = []
    for feed in bert_batches(np.random.default_rng(1)) * 2:
        share = {
            name: value[rank * len(value) // world_size : (rank + 1) * len(value) // world_size]
            for name, value in feed.items()
        }
        losses.append(float(session.run(["loss"], {**share, **LR})[0]))
    engine = session._engine
    inputs = [torch.from_numpy(value) for value in share.values()]
    params = [session.training_state.params[name] for name in engine.train_layout.params]
    module = engine.train_graph.module_for(inputs, [p.detach() for p in params])
    plan = getattr(engine.data_parallel, "plan", None)
    return {
        "losses": np.array(losses),
        "recomputed_segments": np.array(sum(hasattr(child, "segment") for child in module.children())),
        "units": np.array([] if plan is None else list(plan.units)),
        **{f"param/{n}": np.asarray(v) for n, v in session.get_model_state()["full_precision"].items()},
    }
