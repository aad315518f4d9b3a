"""How many of each pattern fusion fire in the converted training graph of each benchmark model.

    .venv/bin/python bench/experiments/fusion_counts.py [--models gpt32 tiny-gpt2 tiny-llama tiny-bert ...]

Converts each model's training graph (ORT's artifacts when its venv is there) for the benchmark batch
and prints the fusion counts (``FUSIONS`` of the eager graph, ``row_linear`` included,
then ``small_attention``: the compiled CPU step's rewrite) and the fx node count with and without them.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import torch

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))

from model_artifacts import prepare_artifacts  # noqa: E402
from models import MODELS  # noqa: E402

import ort_torch_train.passes.pipeline as pipeline  # noqa: E402
from ort_torch_train.api import CheckpointState, Module  # noqa: E402
from ort_torch_train.passes.meta_keys import FUSIONS  # noqa: E402
from ort_torch_train.passes.small_attention import small_attention_products  # noqa: E402


def converted_graphs(directory: Path) -> list[torch.fx.GraphModule]:
    """The converted training graph(s) of one train step on the fixed batch."""
    module = Module(directory / "training_model.onnx", CheckpointState.load_checkpoint(directory / "checkpoint"))
    module.train()
    module(np.load(directory / "x.npy"), np.load(directory / "y.npy"))
    return [graph for graph in module.train_graph._cache.values() if isinstance(graph, torch.fx.GraphModule)]


def count(directory: Path) -> tuple[Counter, int, int]:
    """(fusions, fx nodes fused, fx nodes unfused) of the training graph."""
    (fused,) = converted_graphs(directory)
    original = pipeline.EAGER_PASSES
    pipeline.EAGER_PASSES = tuple(step for step in original if step is not pipeline.fuse_converted)
    try:
        (unfused,) = converted_graphs(directory)
    finally:
        pipeline.EAGER_PASSES = original
    nodes = len(fused.graph.nodes)
    small_attention_products(fused, torch.device("cpu"))  # adds the compiled CPU step's rewrites to the counts
    return FUSIONS.get(fused, Counter()), nodes, len(unfused.graph.nodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        choices=list(MODELS),
        default=["gpt32", "tiny-gpt2", "tiny-llama", "tiny-bert", "tinyformer", "encoder"],
    )
    args = parser.parse_args()
    for name in args.models:
        artifacts = prepare_artifacts(MODELS[name], BENCH / ".cache", use_ort=True)
        onnx_nodes = len(onnx.load(artifacts.directory / "training_model.onnx", load_external_data=False).graph.node)
        fusions, fused, unfused = count(artifacts.directory)
        shown = ", ".join(f"{kind} {n}" for kind, n in sorted(fusions.items()))
        print(
            f"{name} ({artifacts.generator}; {onnx_nodes} ONNX nodes with the gradient graph): fx nodes "
            f"{unfused} -> {fused}; fusions: {shown or 'none'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
