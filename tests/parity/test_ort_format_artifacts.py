"""Training artifacts in ORT format (.ort, made by onnxruntime-training 1.19.2's converter as
``generate_artifacts(ort_format=True)`` makes them) train through the Python API, from files and from bytes,
exactly as the ONNX artifacts do: the same losses, eval loss and parameters, bit for bit; and as ORT 1.19.2
trained the same .ort files (``artifacts_ort/ort_run.npz``) within the tolerance of the ONNX runs' parity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.api import CheckpointState, Module, Optimizer
from tests.helpers.paths import FIXTURES

FIXTURE = FIXTURES / "mlp_ce_adamw_sched"
STEPS, LEARNING_RATE = 20, 0.01  # as tools/fixture_ort_format.py ran ORT

Run = tuple[np.ndarray, float, np.ndarray]


def train(folder: Path, suffix: str, from_bytes: bool) -> Run:
    """20 steps at a constant learning rate from the fixture's checkpoint: losses, eval loss, parameters."""

    def model(name: str) -> Path | bytes:
        path = folder / f"{name}{suffix}"
        return path.read_bytes() if from_bytes else path

    data = np.load(FIXTURE / "data.npz")
    state = CheckpointState.load_checkpoint(FIXTURE / "artifacts" / "checkpoint")
    module = Module(model("training_model"), state, model("eval_model"))
    optimizer = Optimizer(model("optimizer_model"), module)
    optimizer.set_learning_rate(LEARNING_RATE)
    losses = []
    for step in range(STEPS):
        module.train()
        losses.append(float(np.asarray(module(data["x_train"][step], data["y_train"][step]))))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    eval_loss = float(np.asarray(module(data["x_eval"], data["y_eval"])))
    return np.asarray(losses, np.float32), eval_loss, module.get_contiguous_parameters().numpy().copy()


@pytest.fixture(scope="module")
def onnx_run() -> Run:
    return train(FIXTURE / "artifacts", ".onnx", from_bytes=False)


@pytest.mark.parametrize("from_bytes", [False, True], ids=["files", "bytes"])
def test_ort_format_artifacts_train_as_the_onnx_artifacts_bit_for_bit(onnx_run: Run, from_bytes: bool) -> None:
    losses, eval_loss, params = train(FIXTURE / "artifacts_ort", ".ort", from_bytes)
    np.testing.assert_array_equal(losses, onnx_run[0])
    assert eval_loss == onnx_run[1]
    np.testing.assert_array_equal(params, onnx_run[2])


def test_ort_format_artifacts_train_as_onnxruntime_trained_them() -> None:
    losses, eval_loss, params = train(FIXTURE / "artifacts_ort", ".ort", from_bytes=False)
    ort_run = np.load(FIXTURE / "artifacts_ort" / "ort_run.npz")
    np.testing.assert_allclose(losses, ort_run["losses"], rtol=0, atol=1e-5)
    assert abs(eval_loss - float(ort_run["eval_loss"])) <= 1e-5
    np.testing.assert_allclose(params, ort_run["params"], rtol=0, atol=1e-4)
