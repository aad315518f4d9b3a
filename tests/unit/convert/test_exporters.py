"""End to end: small models exported by torch (legacy opset 17 and dynamo opset 18) convert and train.

Parameters become graph inputs (as in ORT's eval models); outputs and parameter gradients of the
converted graph must match the torch model's.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.passes.pipeline import fuse_converted
from tests.helpers.exported_models import export_training_graph, parameters_as_inputs


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, stride=2),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y))).mean((2, 3))


class TinyGPT(nn.Module):
    """Token + position embedding, one causal self-attention block (pre-LayerNorm, GELU MLP), tied head."""

    def __init__(self, vocab: int = 11, d: int = 16, heads: int = 2, context: int = 8):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d)
        self.position = nn.Parameter(torch.randn(context, d) * 0.1)
        self.norm1, self.norm2, self.norm_out = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        batch, length = ids.shape
        x = self.embed(ids) + self.position[:length]
        q, k, v = self.qkv(self.norm1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.reshape(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        attention = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, length, -1))
        x = x + self.mlp(self.norm2(x))
        return self.head(self.norm_out(x))


MODELS = {
    "mlp": (MLP, lambda: torch.randn(5, 6)),
    "cnn": (CNN, lambda: torch.randn(2, 3, 12, 12)),
    "residual": (Residual, lambda: torch.randn(2, 4, 6, 6)),
    "gpt": (TinyGPT, lambda: torch.randint(0, 11, (3, 8))),
}


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy17", "dynamo"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_model_trains_like_torch(name, dynamo):
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model_class, make_input = MODELS[name]
    model, x = model_class().train(), make_input()
    proto = export_training_graph(model, x, dynamo)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    names = parameters_as_inputs(proto, parameters)
    assert names, "no parameter became a graph input"
    copies = [parameters[n].detach().clone().requires_grad_() for n in names]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (x, *copies)]
    opsets = {o.domain: o.version for o in proto.opset_import}
    assert opsets[""] == (17 if not dynamo else opsets[""]) and (opsets[""] >= 18 or not dynamo)
    gm = convert_graph(proto.graph, opsets, specs, training=True)
    fuse_converted(gm, torch.device("cpu"))

    torch.manual_seed(1)
    expected = model(x)
    got = gm(x, *copies)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    (got * weights).sum().backward()
    for n, copy in zip(names, copies):
        torch.testing.assert_close(copy.grad, parameters[n].grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{n}: {m}")
