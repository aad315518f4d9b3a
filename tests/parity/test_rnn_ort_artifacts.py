"""Artifacts made by onnxruntime-training 1.19.2 for a GRU and an LSTM model (its training graphs hold
com.microsoft GRUTraining/LSTMTraining) train here with ORT's own losses, within 1e-5."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.helpers.ort_peer import requires_ort, run_ort
from tests.unit.artifacts.test_rnn_classifiers import train_artifacts

pytestmark = requires_ort

STEPS = 5
LEARNING_RATE = 0.01

ORT_SCRIPT = r"""
import json, os, sys
import numpy as np
import onnxruntime as ort
from onnxruntime.training import artifacts
from onnxruntime.training.api import CheckpointState, Module, Optimizer

ort.set_default_logger_severity(3)
directory, requires_grad, steps, lr = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
os.chdir(directory)  # generate_artifacts writes temporary files to the working directory
artifacts.generate_artifacts("base.onnx", requires_grad=requires_grad, frozen_params=[],
                             loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                             artifact_directory=directory)
data = np.load("data.npz")
module = Module("training_model.onnx", CheckpointState.load_checkpoint("checkpoint"), "eval_model.onnx")
optimizer = Optimizer("optimizer_model.onnx", module)
optimizer.set_learning_rate(lr)
losses = []
for _ in range(steps):
    module.train()
    losses.append(float(np.asarray(module(data["x"], data["y"]))))
    optimizer.step()
    module.lazy_reset_grad()
print(json.dumps(losses))
"""


class Recurrent(nn.Module):
    """Embedding -> forward GRU or LSTM -> Linear head on the last step (ORT trains forward LSTMs only)."""

    def __init__(self, kind: type[nn.GRU] | type[nn.LSTM]) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.rnn = kind(6, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0][:, -1])


@pytest.mark.slow
@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM], ids=["gru", "lstm"])
def test_ort_made_artifacts_train_with_orts_losses(kind: type[nn.Module], tmp_path: Path) -> None:

    torch.manual_seed(0)
    model = Recurrent(kind)
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, 10, (4, 7), generator=generator), torch.randint(0, 3, (4,), generator=generator)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            buffer,
            dynamo=False,
            opset_version=17,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
            input_names=["tokens"],
            output_names=["logits"],
        )
    base = onnx.load_from_string(buffer.getvalue())
    onnx.save(base, tmp_path / "base.onnx")
    np.savez(tmp_path / "data.npz", x=x.numpy(), y=y.numpy())
    parameters = {name for name, _ in model.named_parameters()}
    requires_grad = [init.name for init in base.graph.initializer if init.name in parameters]
    expected = run_ort(ORT_SCRIPT, tmp_path, json.dumps(requires_grad), STEPS, LEARNING_RATE)

    training_model = onnx.load(tmp_path / "training_model.onnx")
    assert f"{kind.__name__}Training" in {node.op_type for node in training_model.graph.node}
    _, losses = train_artifacts(tmp_path, x, y, STEPS, LEARNING_RATE)
    assert losses[-1] < losses[0], losses
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-5)
