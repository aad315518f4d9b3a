"""Converted graph vs. eager torch: forward+backward time of the same model on one thread.

Each model is exported to ONNX (legacy exporter at opset 17, or ``--dynamo``), its parameters are
turned into graph inputs (as ORT's eval models feed them), the graph is converted with
``convert_graph(training=True)``, outputs and gradients are checked against the eager model, and
``out.sum().backward()`` is timed for both, interleaved, median of ``--steps``.

    python bench/experiments/bench_converted_graph.py [--dynamo] [--steps 200] [--only transformer_small]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ort_torch_train.api import set_threads
from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.passes.pipeline import fuse_converted

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench" / "harness"), str(ROOT)]

from timing import interleaved_step_times, median  # noqa: E402

from tests.helpers.exported_models import export_training_graph, parameters_as_inputs  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class Transformer(nn.Module):
    def __init__(self, d_model: int, layers: int):
        super().__init__()
        heads = 2 if d_model < 64 else 8
        layer = nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 4)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "mlp": lambda: (MLP(), torch.randn(64, 784)),
    "cnn": lambda: (CNN(), torch.randn(16, 3, 32, 32)),
    "transformer_small": lambda: (Transformer(16, 1), torch.randn(16, 12, 16)),
    "transformer_large": lambda: (Transformer(256, 4), torch.randn(16, 128, 256)),
}


def run(name: str, dynamo: bool, steps: int) -> None:
    torch.manual_seed(0)
    model, x = MODELS[name]()
    model.train()
    proto = export_training_graph(model, x, dynamo)
    parameters = dict(model.named_parameters())
    names = parameters_as_inputs(proto, parameters)
    copies = [parameters[n].detach().clone().requires_grad_() for n in names]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (x, *copies)]
    opsets = {o.domain: o.version for o in proto.opset_import}
    gm = convert_graph(proto.graph, opsets, specs, training=True)
    fuse_converted(gm, torch.device("cpu"))

    expected, got = model(x), gm(x, *copies)[0]
    expected.sum().backward()
    got.sum().backward()
    output_error = (expected - got).abs().max().item()
    grad_error = max((parameters[n].grad - c.grad).abs().max().item() for n, c in zip(names, copies))

    times = interleaved_step_times(
        {"eager": lambda: model(x).sum().backward(), "converted": lambda: gm(x, *copies)[0].sum().backward()},
        rounds=steps,
        steps_per_round=1,
        warmup=max(steps // 10, 5),
    )
    eager_us, converted_us = (median(times[name]) * 1e6 for name in ("eager", "converted"))
    print(
        f"{name:18s} eager {eager_us:9.0f} us  converted {converted_us:9.0f} us  ratio {converted_us / eager_us:5.3f}"
        f"  |out err| {output_error:.1e}  |grad err| {grad_error:.1e}  fx nodes {len(gm.graph.nodes)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dynamo", action="store_true", help="export with torch's dynamo exporter")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--only", choices=sorted(MODELS), action="append")
    args = parser.parse_args()
    set_threads(1)
    for name in args.only or MODELS:
        steps = max(args.steps // 10, 10) if name == "transformer_large" else args.steps
        run(name, args.dynamo, steps)


if __name__ == "__main__":
    main()
