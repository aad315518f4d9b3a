"""Where start-up time goes is logged at INFO: the checkpoint read and each graph's conversion."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from ort_torch_train.api import CheckpointState, Module
from tests.helpers.paths import FIXTURES

ARTIFACTS = FIXTURES / "mlp_ce_adamw_sched" / "artifacts"


def test_the_checkpoint_read_and_the_conversion_are_timed_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ort_torch_train"):
        state = CheckpointState.load_checkpoint(str(ARTIFACTS / "checkpoint"))
        module = Module(str(ARTIFACTS / "training_model.onnx"), state, str(ARTIFACTS / "eval_model.onnx"))
        module(np.zeros((4, 20), np.float32), np.zeros(4, np.int64))
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("loaded checkpoint") and m.endswith(" s") for m in messages), messages
    assert any(m.startswith("converted the training graph in ") for m in messages), messages
