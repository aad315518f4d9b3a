"""Whole training runs against ORT 1.19.2: 20-step trajectories, eval loss, optimizer state, resume."""

from __future__ import annotations

import numpy as np
import pytest

from ort_torch_train.api import CheckpointState
from tests.helpers.corpus import loss_of


def _train(case, module, optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        optimizer.set_learning_rate(case.lr_before(step))
        module.train()
        losses.append(loss_of(module(*case.train_inputs(step))))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def _trained(case, implementation=None):
    module = case.module()
    optimizer = case.optimizer(module, implementation)
    losses = _train(case, module, optimizer, range(case.steps))
    return module, optimizer, losses


def _deterministic(case):
    if not case.deterministic:
        pytest.skip("ORT's training step is random here (dropout)")


@pytest.mark.parametrize("implementation", [None, "foreach"], ids=["default-kernel", "foreach-kernel"])
def test_trajectory_matches_ort(case, implementation):
    _deterministic(case)
    module, optimizer, losses = _trained(case, implementation)
    np.testing.assert_allclose(losses, case.expected["train"]["losses"], rtol=0, atol=1e-5)
    for name in case.param_names:
        np.testing.assert_allclose(
            module.training_state.params[name].detach().numpy(), case.arrays[f"final__{name}"], rtol=0, atol=1e-4
        )
    module.eval()
    eval_loss = loss_of(module(*case.eval_inputs()))
    assert abs(eval_loss - case.expected["train"]["eval_loss"]) <= 1e-5


def test_optimizer_state_matches_ort(case):
    _deterministic(case)
    module, _, _ = _trained(case)
    state = module.training_state.optimizer
    [group] = case.expected["final_checkpoint_optimizer_groups"]
    assert state.step == group["step"]
    for name in group["params"]:
        for momentum in group["momentum_names"]:
            key = f"optim_state__group0__{name}__{momentum}"
            np.testing.assert_allclose(state.momentums[name][momentum].numpy(), case.arrays[key], rtol=0, atol=1e-4)


@pytest.mark.parametrize("saved", ["final_checkpoint_with_optimizer", "final_checkpoint_no_optimizer"])
def test_resume_from_ort_written_checkpoint(case, saved):
    _deterministic(case)
    resume = case.expected["resume"]
    state = CheckpointState.load_checkpoint(case.root / saved)
    module = case.module(state)
    optimizer = case.optimizer(module)
    assert optimizer.get_learning_rate() == pytest.approx(resume["lr_right_after_reload_with_optimizer"])
    losses = []
    for _ in range(2):
        optimizer.set_learning_rate(resume["lr_used"])
        losses.append(loss_of(module(*case.train_inputs(0))))
        optimizer.step()
        module.lazy_reset_grad()
    key = "reloaded_with_optimizer_losses" if saved.endswith("with_optimizer") else "reloaded_no_optimizer_losses"
    np.testing.assert_allclose(losses, resume[key], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_resume_from_own_checkpoint_is_bit_exact(case, tmp_path):
    _deterministic(case)
    half = case.steps // 2
    module = case.module()
    optimizer = case.optimizer(module)
    first = _train(case, module, optimizer, range(half))
    path = tmp_path / "checkpoint"
    CheckpointState.save_checkpoint(module.checkpoint_state, path, include_optimizer_state=True)
    uninterrupted = _train(case, module, optimizer, range(half, case.steps))

    resumed_module = case.module(CheckpointState.load_checkpoint(path))
    resumed_optimizer = case.optimizer(resumed_module)
    resumed = _train(case, resumed_module, resumed_optimizer, range(half, case.steps))
    assert resumed == uninterrupted
    assert len(first) == half
    for name, param in module.training_state.params.items():
        assert np.array_equal(param.detach().numpy(), resumed_module.training_state.params[name].detach().numpy())
