"""Train the same artifacts eagerly and compiled, and check that the compiled step is one Dynamo graph that
trains as eager does: the shared check of the data-dependent-size and dynamic-table tests."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.torch_internals import compile_counters


def train_counting_graphs(
    directory: Path,
    batches: Sequence[tuple],
    compile: bool | dict[str, str],
    caplog: pytest.LogCaptureFixture,
    refused: Sequence[str],
) -> tuple[list[float], np.ndarray, int]:
    """Losses, final parameters and Dynamo graphs of one step per batch (learning rate 1e-3: AdamW turns
    rounding-sized gradients into steps of its size); no log line of the run holds a phrase of ``refused``."""
    torch._dynamo.reset()
    compile_counters().clear()
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, compile=compile, compile_cache=False)
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(1e-3)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ort_torch_train"):
        losses = [float(np.asarray(module.step(optimizer, *batch)).reshape(-1)[0]) for batch in batches]
    assert not [r.getMessage() for r in caplog.records if any(phrase in r.getMessage() for phrase in refused)]
    return losses, module.get_contiguous_parameters().numpy(), compile_counters()["stats"]["unique_graphs"]


def assert_one_graph_like_eager(
    directory: Path, batches: Sequence[tuple], caplog: pytest.LogCaptureFixture, refused: Sequence[str]
) -> None:
    """The compiled run is one Dynamo graph; its losses and final parameters equal eager's within 1e-5."""
    eager_losses, eager_parameters, _ = train_counting_graphs(directory, batches, False, caplog, refused)
    losses, parameters, graphs = train_counting_graphs(directory, batches, True, caplog, refused)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-5)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-5)
