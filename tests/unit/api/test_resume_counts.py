"""What a resumed loop reads back: CheckpointState.step (the optimizer steps a checkpoint saved),
Properties.get, and LR schedulers that refuse a total already behind the optimizer's count."""

from __future__ import annotations

from pathlib import Path

import pytest

from ort_torch_train.api import CheckpointState, CosineLRScheduler, LinearLRScheduler, Module, Optimizer
from tests.helpers.corpus import Case

STEPS = 4


def _trained_checkpoint(case: Case, path: Path, include_optimizer_state: bool = True) -> CheckpointState:
    state = CheckpointState.load_checkpoint(case.artifact("checkpoint"))
    module = Module(case.artifact("training_model.onnx"), state)
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    assert state.step == 0
    for step in range(STEPS):
        module(*case.train_inputs(step))
        optimizer.step()
        module.lazy_reset_grad()
    assert state.step == STEPS
    state.properties["epoch"] = 3
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=include_optimizer_state)
    return CheckpointState.load_checkpoint(path)


def _resumed_optimizer(case: Case, state: CheckpointState) -> Optimizer:
    return Optimizer(case.artifact("optimizer_model.onnx"), Module(case.artifact("training_model.onnx"), state))


def test_state_step_is_the_saved_optimizer_step_count(mlp_case: Case, tmp_path: Path) -> None:
    assert _trained_checkpoint(mlp_case, tmp_path / "with").step == STEPS
    assert _trained_checkpoint(mlp_case, tmp_path / "without", include_optimizer_state=False).step == 0


def test_properties_get_like_a_dict(mlp_case: Case, tmp_path: Path) -> None:
    properties = _trained_checkpoint(mlp_case, tmp_path / "ckpt").properties
    assert properties.get("epoch") == 3 and properties["epoch"] == 3
    assert properties.get("missing") is None and properties.get("missing", 7) == 7
    with pytest.raises(KeyError, match="missing"):
        properties["missing"]


def test_schedule_whose_total_is_behind_the_resumed_count_is_refused(mlp_case: Case, tmp_path: Path) -> None:
    """Before: a total counted from 0 after resuming trained every step at learning rate 0, silently."""
    state = _trained_checkpoint(mlp_case, tmp_path / "ckpt")
    optimizer = _resumed_optimizer(mlp_case, state)
    for total in (STEPS - 1, STEPS):
        with pytest.raises(
            ValueError, match=rf"total_step_count \({total}\) is not above .* completed steps \({STEPS}"
        ):
            LinearLRScheduler(optimizer, 0, total, 0.01)
    with pytest.raises(ValueError, match="CosineLRScheduler"):
        CosineLRScheduler(optimizer, 0, STEPS, 0.01)
    CosineLRScheduler(optimizer, 0, STEPS, 0.01, min_lr_ratio=0.1)  # ends at 0.1 x the rate, not 0
    assert optimizer.get_learning_rate() > 0
    LinearLRScheduler(optimizer, 0, state.step + 10, 0.01)
    assert optimizer.get_learning_rate() > 0
