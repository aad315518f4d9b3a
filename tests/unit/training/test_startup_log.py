"""Where start-up time goes is logged at INFO: the checkpoint read, each graph's conversion and its passes,
each a phase with a start and an end record; the command line shows those after its inputs are checked
(a bar for the conversion's nodes, a line as each ends) and ``--quiet`` hides them."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.cli.main import main
from tests.helpers.paths import FIXTURES

CASE = FIXTURES / "mlp_ce_adamw_sched"
ARTIFACTS = CASE / "artifacts"
PHASE_ENDS = (
    r"loaded checkpoint .+checkpoint'?: \d+ parameters in \d+\.\d+ s",
    r"converted the training graph in \d+\.\d+ s",
    r"prepared the training graph \(graph passes\) in \d+\.\d+ s",
)


def test_the_checkpoint_read_and_the_conversion_are_timed_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ort_torch_train"):
        state = CheckpointState.load_checkpoint(str(ARTIFACTS / "checkpoint"))
        module = Module(str(ARTIFACTS / "training_model.onnx"), state, str(ARTIFACTS / "eval_model.onnx"))
        module(np.zeros((4, 20), np.float32), np.zeros(4, np.int64))
    messages = [record.getMessage() for record in caplog.records]
    starts = (
        r"reading the checkpoint \S+ \.\.\.",
        r"converting the training graph \(\d+ nodes\) \.\.\.",
        r"preparing the training graph \.\.\.",
    )
    for start, end in zip(starts, PHASE_ENDS):
        began = next(i for i, m in enumerate(messages) if re.fullmatch(start, m))
        assert any(re.fullmatch(end, m) for m in messages[began + 1 :]), (end, messages)


def test_the_command_line_shows_the_phases_and_quiet_hides_them(capsys: pytest.CaptureFixture, tmp_path) -> None:
    common = [
        "train",
        ARTIFACTS,
        "--data",
        CASE / "data.npz",
        "--inputs",
        "x_train,y_train",
        "--batched",
        "--steps",
        "1",
    ]
    assert main([str(arg) for arg in [*common, "--output", tmp_path / "shown"]]) == 0
    shown = capsys.readouterr().err
    for end in PHASE_ENDS[1:]:  # from the model's conversion on (one decimal on the terminal)
        assert re.search(end.replace(r"\d+\.\d+ s", r"\d+\.\d s$"), shown, re.MULTILINE), (end, shown)
    assert main([str(arg) for arg in [*common, "--output", tmp_path / "quiet", "--quiet"]]) == 0
    quiet = capsys.readouterr().err
    assert not any(re.search(end, quiet) for end in PHASE_ENDS), quiet
