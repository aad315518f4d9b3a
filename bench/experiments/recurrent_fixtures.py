"""GRU and LSTM classifiers as fixture-shaped folders for ``packaged_parity.py --fixtures``: artifacts made by
onnxruntime-training 1.19.2's generate_artifacts (its training graphs hold com.microsoft GRUTraining and
LSTMTraining), the batches in ``data.npz`` and their keys in ``expected.json``, as tests/fixtures lays them out.

    .venv-ort/bin/python bench/experiments/recurrent_fixtures.py [--out bench/.cache/recurrent-fixtures]

Each model: token embedding -> forward GRU or LSTM (ORT trains forward LSTMs only) -> linear head on the last
step, hidden size 12, batch 8 (a symbolic axis: the eval batches hold 16), sequence 7 (fixed), CrossEntropy, AdamW.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnxruntime.training import artifacts
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
STEPS, BATCH, EVAL_BATCH, LENGTH, TOKENS, CLASSES, HIDDEN = 20, 8, 16, 7, 10, 3, 12


class Recurrent(nn.Module):
    """Embedding -> forward GRU or LSTM -> Linear head on the last step."""

    def __init__(self, kind: type[nn.GRU] | type[nn.LSTM]) -> None:
        super().__init__()
        self.embed = nn.Embedding(TOKENS, 6)
        self.rnn = kind(6, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0][:, -1])


def make(name: str, kind: type[nn.GRU] | type[nn.LSTM], folder: Path) -> None:
    """The fixture ``name`` in ``folder``."""
    torch.manual_seed(0)
    model = Recurrent(kind)
    generator = torch.Generator().manual_seed(2)
    x_train = torch.randint(0, TOKENS, (STEPS, BATCH, LENGTH), generator=generator)
    y_train = torch.randint(0, CLASSES, (STEPS, BATCH), generator=generator)
    x_eval = torch.randint(0, TOKENS, (EVAL_BATCH, LENGTH), generator=generator)
    y_eval = torch.randint(0, CLASSES, (EVAL_BATCH,), generator=generator)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x_train[0],),
            buffer,
            dynamo=False,
            opset_version=17,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
            input_names=["tokens"],
            output_names=["logits"],
            dynamic_axes={"tokens": {0: "batch"}, "logits": {0: "batch"}},
        )
    base = onnx.load_from_string(buffer.getvalue())
    parameters = {name for name, _ in model.named_parameters()}
    requires_grad = [init.name for init in base.graph.initializer if init.name in parameters]
    out = folder / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    os.chdir(out)  # generate_artifacts writes temporary files to the working directory
    try:
        artifacts.generate_artifacts(
            base,
            requires_grad=requires_grad,
            frozen_params=[],
            loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=artifacts.OptimType.AdamW,
            artifact_directory=out,
        )
    finally:
        os.chdir(here)
    arrays = {"x_train": x_train, "y_train": y_train, "x_eval": x_eval, "y_eval": y_eval}
    np.savez(folder / "data.npz", **{key: value.numpy() for key, value in arrays.items()})
    keys = {"train": ["x_train", "y_train"], "eval": ["x_eval", "y_eval"]}
    (folder / "expected.json").write_text(json.dumps({"name": name, "data_keys": keys}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / ".cache" / "recurrent-fixtures")
    args = parser.parse_args()
    for name, kind in (("gru", nn.GRU), ("lstm", nn.LSTM)):
        make(name, kind, args.out / name)
        print("wrote", args.out / name)


if __name__ == "__main__":
    main()
