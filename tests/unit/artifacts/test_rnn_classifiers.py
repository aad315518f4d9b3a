"""GRU and LSTM classifiers: torch.nn.Module -> generate_artifacts (legacy and dynamo exporters) ->
AdamW training here, with the same losses as the same model trained in plain PyTorch."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

STEPS = 6
LEARNING_RATE = 0.01
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::UserWarning")


def train_artifacts(
    directory: Path, x: torch.Tensor, y: torch.Tensor, steps: int, learning_rate: float
) -> tuple[Module, list[float]]:
    """ORT's loop on the artifacts in ``directory``, ``steps`` times on (x, y): the module and its losses."""
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    optimizer = Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(learning_rate)
    losses = []
    for _ in range(steps):
        module.train()
        losses.append(float(module(x.numpy(), y.numpy())))
        optimizer.step()
        module.lazy_reset_grad()
    return module, losses


class GRUClassifier(nn.Module):
    """Token embedding -> GRU -> linear head on the last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, hidden = self.gru(self.embed(tokens))
        return self.head(hidden[-1])


class LSTMClassifier(nn.Module):
    """Linear input projection -> bidirectional LSTM -> mean over time -> linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(5, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True, bidirectional=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(torch.tanh(self.project(x)))
        return self.head(y.mean(1))


def _data(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if name == "gru":
        x = torch.randint(0, 12, (4, 6), generator=generator)
    else:
        x = torch.randn(4, 6, 5, generator=generator)
    return x, torch.randint(0, 3, (4,), generator=generator)


MODELS = {"gru": GRUClassifier, "lstm": LSTMClassifier}
EXPORTERS = [
    pytest.param("legacy", id="legacy"),
    pytest.param(
        "dynamo",
        id="dynamo",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("onnxscript") is None,
            reason="the dynamo exporter needs onnxscript, which is not installed",
        ),
    ),
]


def _adamw_attributes(path: Path) -> dict:
    (node,) = [n for n in onnx.load(path).graph.node if n.op_type == "AdamWOptimizer"]
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _train_in_torch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, attrs: dict) -> list[float]:
    """Plain PyTorch training with ORT's AdamW (adam_mode 1, the HF formula; ../shared/spec/ORT_SEMANTICS.md)."""
    assert attrs["adam_mode"] == 1 and attrs["correct_bias"] == 1
    beta1, beta2, eps, decay = attrs["alpha"], attrs["beta"], attrs["epsilon"], attrs["weight_decay"]
    params = list(model.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    losses = []
    for step in range(1, STEPS + 1):
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            scale = LEARNING_RATE * (1 - beta2**step) ** 0.5 / (1 - beta1**step)
            for p, (m, v) in zip(params, moments):
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.sub_(scale * m / (v.sqrt() + eps))
                p.sub_(LEARNING_RATE * decay * p)
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(MODELS))
def test_classifier_trains_like_plain_pytorch(name: str, exporter: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MODELS[name]()
    x, y = _data(name)
    reference = copy.deepcopy(model)
    generate_artifacts(
        model,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(x,),
        exporter=exporter,
    )
    op_types = {n.op_type for n in onnx.load(tmp_path / "training_model.onnx").graph.node}
    assert name.upper() in op_types, sorted(op_types)

    module, losses = train_artifacts(tmp_path, x, y, STEPS, LEARNING_RATE)
    module.eval()
    eval_loss = float(module(x.numpy(), y.numpy()))

    expected = _train_in_torch(reference, x, y, _adamw_attributes(tmp_path / "optimizer_model.onnx"))
    assert losses[-1] < losses[0], losses
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=1e-5, rtol=0)
    with torch.no_grad():
        assert abs(eval_loss - F.cross_entropy(reference.eval()(x), y).item()) < 1e-5
