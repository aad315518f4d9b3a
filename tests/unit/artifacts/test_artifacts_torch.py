"""torch.nn.Module -> generate_artifacts -> train -> export for inference -> onnxruntime, per model family.

Families: an MLP (with Dropout), a CNN with BatchNorm, a ResNet-style residual block, a small
GPT-style decoder (causal attention, LayerNorm, GELU, tied embedding); each exported with the
legacy exporter (opset 17) and the dynamo exporter (torch's default opset, 20).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.checkpoint.odtc import read_checkpoint

STEPS = 8
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(6 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class ResNet(nn.Module):
    """A stem convolution, one residual block (conv-bn-relu-conv-bn + skip), global pooling, a head."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem(x))
        h = F.relu(h + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(h))))))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class GPT(nn.Module):
    """One pre-norm decoder block with causal self-attention; the LM head reuses the token embedding."""

    def __init__(self, vocab: int = 16, width: int = 16, heads: int = 2, length: int = 6) -> None:
        super().__init__()
        self.vocab, self.heads = vocab, heads
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(length, width) * 0.02)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.register_buffer("causal", torch.triu(torch.ones(length, length, dtype=torch.bool), 1), persistent=False)

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        batch, length, width = h.shape
        q, k, v = (t.reshape(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(h).split(width, -1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(width // self.heads)
        scores = scores.masked_fill(self.causal[:length, :length], float("-inf"))
        return self.proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(batch, length, width))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos[: tokens.shape[1]]
        h = h + self.attention(self.ln1(h))
        h = h + self.mlp(self.ln2(h))
        return (self.ln_f(h) @ self.tok.weight.t()).reshape(-1, self.vocab)  # tied embedding


def data(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    if family == "gpt":
        tokens = torch.randint(0, 16, (4, 6), generator=generator)
        return tokens, torch.randint(0, 16, (24,), generator=generator)
    shape = {"mlp": (8, 10), "cnn": (8, 1, 8, 8), "resnet": (8, 3, 8, 8)}[family]
    return torch.randn(shape, generator=generator), torch.randint(0, 4, (8,), generator=generator)


FAMILIES = {"mlp": MLP, "cnn": CNN, "resnet": ResNet, "gpt": GPT}
HAS_ONNXSCRIPT = importlib.util.find_spec("onnxscript") is not None
EXPORTERS = [
    pytest.param("legacy", id="legacy"),
    pytest.param(
        "dynamo",
        id="dynamo",
        marks=pytest.mark.skipif(
            not HAS_ONNXSCRIPT, reason="the dynamo exporter needs onnxscript, which is not installed"
        ),
    ),
]


def open_training(directory: Path):
    from ort_torch_train.api.checkpoint_state import CheckpointState
    from ort_torch_train.api.module import Module
    from ort_torch_train.api.optimizer import Optimizer

    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    return state, module, Optimizer(str(directory / "optimizer_model.onnx"), module)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_and_exports_for_inference(family: str, exporter: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = FAMILIES[family]()
    x, y = data(family)
    generate_artifacts(
        model,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(x,),
        exporter=exporter,
        additional_output_names=["output"],
    )

    checkpoint = read_checkpoint(tmp_path / "checkpoint")
    assert sorted(checkpoint.trainable) == sorted(name for name, _ in model.named_parameters())
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert eval_model.ir_version <= 10 and all(o.version <= 21 for o in eval_model.opset_import if o.domain == "")

    state, module, optimizer = open_training(tmp_path)
    optimizer.set_learning_rate(0.01)
    losses = []
    for _ in range(STEPS):
        module.train()
        losses.append(float(module(x.numpy(), y.numpy())[0]))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.8 * losses[0], losses

    module.eval()
    _, logits = module(x.numpy(), y.numpy())
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["output"])
    session = onnxruntime.InferenceSession(str(tmp_path / "inference.onnx"), providers=["CPUExecutionProvider"])
    (inferred,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(inferred, logits, rtol=1e-5, atol=1e-5)


def test_export_leaves_the_module_untouched_and_follows_requires_grad(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = CNN().eval()
    model.features[0].requires_grad_(False)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    generate_artifacts(
        model,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.SGD,
        artifact_directory=tmp_path,
        example_inputs=torch.randn(2, 1, 8, 8),
    )
    assert not model.training
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    checkpoint = read_checkpoint(tmp_path / "checkpoint")
    assert sorted(checkpoint.frozen) == ["features.0.bias", "features.0.weight"]
    assert sorted(checkpoint.trainable) == ["features.1.bias", "features.1.weight", "head.bias", "head.weight"]
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert [v.name for v in eval_model.graph.input][:2] == ["x", "labels"]
    assert eval_model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert "features.1.running_mean" in {i.name for i in eval_model.graph.initializer}  # stats stay constants
    (batchnorm,) = [n for n in eval_model.graph.node if n.op_type == "BatchNormalization"]
    assert len(batchnorm.output) == 1 and {a.name: a.i for a in batchnorm.attribute}["training_mode"] == 0


def test_torch_module_needs_example_inputs(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="example_inputs"):
        generate_artifacts(MLP(), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['opset'\]"):
        generate_artifacts(MLP(), example_inputs=torch.randn(2, 10), opset=17, artifact_directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_batchnorm_in_training_mode_gets_a_word_about_its_running_statistics(tmp_path: Path) -> None:
    """BatchNorm trains on batch statistics while its running mean and variance stay constants: said
    once, at generate time; a model without BatchNorm gets no warning."""
    with pytest.warns(UserWarning, match=r"1 BatchNormalization node\(s\) .* running mean and variance stay") as caught:
        generate_artifacts(
            CNN(),
            loss=LossType.CrossEntropyLoss,
            artifact_directory=tmp_path / "cnn",
            example_inputs=torch.randn(2, 1, 8, 8),
        )
    ours = [w for w in caught if "BatchNormalization" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == __file__, [str(w.message)[:200] for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate_artifacts(
            MLP(),
            loss=LossType.CrossEntropyLoss,
            artifact_directory=tmp_path / "mlp",
            example_inputs=torch.randn(2, 10),
        )
