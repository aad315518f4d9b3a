"""Every example in examples/, run with small sizes: their summaries and the files they write.

The torch.compile path of pytorch_interop.py costs a minute of inductor compilation on a small CPU,
so the main run uses --no-compile and ``test_pytorch_interop_compiled`` (marked ``compile``;
deselect with ``-m "not compile"``) runs it compiled, with the fewest steps. train_ddp.py runs
under torchrun in test_distributed_launch.py.
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime
import pytest

from ort_torch_train.api import CheckpointState
from tests.helpers.paths import FIXTURES, REFCORPUS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_train_digits(example, tmp_path) -> None:
    summary = example("train_digits").main(["--epochs", "8", "--out", str(tmp_path)])
    assert summary["steps"] == 8 * (1437 // 32)
    assert summary["test_accuracy"] >= 0.95
    assert summary["onnxruntime_test_accuracy"] == summary["test_accuracy"]
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert state.training_state.optimizer.step == summary["steps"]
    assert state.properties["epoch"] == 8
    session = onnxruntime.InferenceSession(str(tmp_path / "inference.onnx"), providers=["CPUExecutionProvider"])
    [logits] = session.run(None, {"images": np.zeros((3, 64), np.float32)})
    assert logits.shape == (3, 10)
    assert (tmp_path / "training.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.slow
def test_resume_training_is_bit_exact(example, tmp_path) -> None:
    summary = example("resume_training").main(["--steps", "12", "--resume-at", "5", "--out", str(tmp_path)])
    assert summary["bit_exact_losses"] and summary["bit_exact_parameters"]
    assert summary["losses_resumed"] == summary["losses_uninterrupted"] and len(summary["losses_resumed"]) == 12
    saved = CheckpointState.load_checkpoint(summary["checkpoint"]).training_state
    assert saved.optimizer.step == 5 and saved.optimizer.momentums


@pytest.mark.slow
def test_continue_ort_artifacts(example, tmp_path) -> None:
    if not any(root.is_dir() for root in (FIXTURES, REFCORPUS)):
        pytest.skip("no ORT case folder present")
    summary = example("continue_ort_artifacts").main(["--steps", "3", "--out", str(tmp_path)])
    assert summary["end_step"] == summary["start_step"] + 3
    assert all(math.isfinite(loss) for loss in summary["losses"])
    assert summary["onnxruntime_eval_loss"] == pytest.approx(summary["eval_loss_after"], rel=1e-5)
    if summary["ort_eval_loss_before"] is not None:  # started from ORT's own final checkpoint
        assert summary["eval_loss_before"] == pytest.approx(summary["ort_eval_loss_before"], rel=1e-5)
    assert summary["inference_outputs"]
    saved = CheckpointState.load_checkpoint(summary["checkpoint"]).training_state
    assert saved.optimizer.step == summary["end_step"]


def check_interop(summary: dict) -> None:
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] < summary["first_loss"]
    assert summary["scheduler_lr_matches"]
    assert summary["state_dict_names_match"]
    assert summary["torch_model_max_abs_difference"] < 1e-5


@pytest.mark.slow
def test_pytorch_interop(example, tmp_path) -> None:
    summary = example("pytorch_interop").main(
        ["--no-compile", "--steps", "12", "--autocast-steps", "3", "--out", str(tmp_path)]
    )
    check_interop(summary)
    assert summary["autocast_steps"] == 3 and summary["autocast_max_relative_gap"] < 0.02


@pytest.mark.slow
@pytest.mark.compile
def test_pytorch_interop_compiled(example, tmp_path) -> None:
    """The example with torch.compile (about a minute of compilation on 2 CPU cores)."""
    summary = example("pytorch_interop").main(["--steps", "4", "--autocast-steps", "0", "--out", str(tmp_path)])
    assert summary["compiled"]
    check_interop(summary)
