"""Demos: a RoBERTa classifier from a transformers config and a MobileNetV3 block exported at opset 22 and 23
train here with the same losses as the same models trained in plain PyTorch (both with SGD)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

pytestmark = pytest.mark.filterwarnings("ignore")
LR = 0.1


def train_both(model: nn.Module, batches, directory: Path, **export) -> tuple[list[float], list[float]]:
    """Losses of ``model`` trained as artifacts through Module/Optimizer and as itself with torch.optim.SGD."""
    reference = copy.deepcopy(model)
    generate_artifacts(
        model,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.SGD,
        artifact_directory=directory,
        example_inputs=tuple(torch.from_numpy(a) for a in batches[0][:-1]),
        **export,
    )
    module = Module(
        directory / "training_model.onnx",
        CheckpointState.load_checkpoint(directory / "checkpoint"),
        directory / "eval_model.onnx",
    )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(LR)
    ours = []
    for batch in batches:
        ours.append(float(module(*batch)))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    assert np.isfinite(float(module(*batches[0])))
    reference.train()
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    theirs = []
    for *inputs, labels in batches:
        loss = F.cross_entropy(reference(*(torch.from_numpy(a) for a in inputs)), torch.from_numpy(labels))
        theirs.append(loss.item())
        loss.backward()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
    return ours, theirs


@pytest.mark.slow
def test_roberta_from_a_config_trains_like_pytorch(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    vocab, labels = 50, 3

    class RobertaClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = transformers.RobertaConfig(
                vocab_size=vocab,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=24,
                type_vocab_size=1,
                num_labels=labels,
                pad_token_id=1,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
            self.roberta = transformers.RobertaForSequenceClassification(config)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.roberta(input_ids=input_ids, attention_mask=attention_mask).logits

    rng = np.random.default_rng(0)
    batches = []
    for _ in range(4):
        ids = rng.integers(2, vocab, (4, 8), dtype=np.int64)
        ids[1, 6:], ids[3, 5:] = 1, 1  # padding: RoBERTa's position ids come from a CumSum over the non-pad mask
        batches.append((ids, (ids != 1).astype(np.int64), (ids[:, 0] % labels).astype(np.int64)))
    torch.manual_seed(0)
    ours, theirs = train_both(RobertaClassifier(), batches, tmp_path)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    assert len(set(ours)) == len(ours)  # the steps changed the weights


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, reduced, 1), nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class MobileNetV3Block(nn.Module):
    """Stem, then an inverted residual: expand, depthwise, squeeze-excite (HardSigmoid), project; HardSwish."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        self.expand = nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.depthwise = nn.Sequential(
            nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.Hardswish()
        )
        self.se = SqueezeExcite(16, 4)
        self.project = nn.Sequential(nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.project(self.se(self.depthwise(self.expand(x))))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


@pytest.mark.slow
@pytest.mark.parametrize("opset", [22, 23])
def test_mobilenetv3_block_exported_at_a_modern_opset_trains_like_pytorch(tmp_path: Path, opset: int) -> None:
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((4, 3, 12, 12)).astype(np.float32), rng.integers(0, 4, 4).astype(np.int64))
        for _ in range(3)
    ]
    torch.manual_seed(0)
    ours, theirs = train_both(MobileNetV3Block(), batches, tmp_path, exporter="dynamo", opset_version=opset)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    model = onnx.load(tmp_path / "training_model.onnx")
    assert {"HardSwish", "HardSigmoid"} <= {node.op_type for node in model.graph.node}
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == opset
