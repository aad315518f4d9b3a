"""``Optimizer`` and the LR schedulers, the faces of ``onnxruntime.training.api`` over the optimizer core,
on a stand-in module (``api.protocols.TrainableModule``)."""

from __future__ import annotations

import pytest
import torch

from ort_torch_train.api.optimizer import (
    ConstantWithWarmupLRScheduler,
    CosineLRScheduler,
    LinearLRScheduler,
    Optimizer,
)
from ort_torch_train.errors import DistributedError
from tests.helpers.optimizer_models import F32, NAMES, fake_module, make_state, optimizer_model, set_grads


def test_optimizer_face(tmp_path):
    path = tmp_path / "optimizer_model.onnx"
    path.write_bytes(optimizer_model("adamw", adam_mode=1, epsilon=1e-6, weight_decay=0.0))
    state = make_state()
    optimizer = Optimizer(path, fake_module(state))
    assert optimizer.get_learning_rate() == F32(0.001)
    optimizer.set_learning_rate(0.02)
    assert optimizer.get_learning_rate() == F32(0.02)
    set_grads(state, 0)
    before = state.params["fc1.weight"].detach().clone()
    optimizer.step()
    assert state.optimizer.step == 1 and not torch.equal(before, state.params["fc1.weight"])
    with pytest.raises(ValueError):
        optimizer.set_learning_rate(-1)


def test_linear_scheduler_documented_semantics():
    state = make_state()
    optimizer = Optimizer(optimizer_model("sgd"), fake_module(state))
    scheduler = LinearLRScheduler(optimizer, 2, 6, 0.1)
    assert optimizer.get_learning_rate() == 0.0  # applied at construction, warmup starts at 0
    assert state.optimizer.initial_learning_rate == F32(0.1)
    lrs = []
    for _ in range(8):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.get_learning_rate())
    expected = [0.05, 0.1, 0.075, 0.05, 0.025, 0.0, 0.0, 0.0]
    assert lrs == [F32(F32(0.1) * F32(e / 0.1)) for e in expected]


def test_scheduler_validation():
    optimizer = Optimizer(optimizer_model("sgd"), fake_module(make_state()))
    with pytest.raises(ValueError, match=r"warmup step count \(30\) must not exceed total step count \(20\)"):
        LinearLRScheduler(optimizer, 30, 20, 0.1)
    with pytest.raises(ValueError, match="must be >= 0"):
        CosineLRScheduler(optimizer, -1, 20, 0.1)
    with pytest.raises(ValueError, match="initial learning rate must be finite"):
        ConstantWithWarmupLRScheduler(optimizer, 2, float("nan"))
    with pytest.raises(ValueError, match="min_ratio"):
        CosineLRScheduler(optimizer, 0, 10, 0.1, min_lr_ratio=2.0)
    with pytest.raises(TypeError, match="ort_torch_train Optimizer"):
        LinearLRScheduler(object(), 1, 2, 0.1)


def test_cosine_and_constant_schedulers():
    optimizer = Optimizer(optimizer_model("sgd"), fake_module(make_state()))
    cosine = CosineLRScheduler(optimizer, 0, 4, 1.0, min_lr_ratio=0.5)
    assert optimizer.get_learning_rate() == 1.0
    for _ in range(2):
        optimizer.step()
    cosine.step()
    assert optimizer.get_learning_rate() == F32(0.75)
    constant = ConstantWithWarmupLRScheduler(optimizer, 4, 0.2)  # 2 steps done: half way up
    assert optimizer.get_learning_rate() == F32(0.1)
    for _ in range(3):
        optimizer.step()
    constant.step()
    assert optimizer.get_learning_rate() == F32(0.2)


def test_torch_lr_scheduler_drives_the_learning_rate():
    state = make_state()
    optimizer = Optimizer(optimizer_model("sgd"), fake_module(state))
    torch_optimizer = optimizer.torch_optimizer
    assert isinstance(torch_optimizer, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch_optimizer, lambda epoch: 0.5**epoch)
    seen = []
    for step in range(3):
        set_grads(state, step)
        before = state.params["fc1.bias"].detach().clone()
        grad = state.params["fc1.bias"].grad.clone()
        optimizer.step()
        seen.append(optimizer.get_learning_rate())
        torch.testing.assert_close(state.params["fc1.bias"].detach(), before - seen[-1] * grad)
        scheduler.step()
    assert seen == [F32(0.001), F32(0.0005), F32(0.00025)]
    optimizer.set_learning_rate(0.3)
    assert torch_optimizer.param_groups[0]["lr"] == F32(0.3)
    torch_optimizer.zero_grad()
    assert all(torch.count_nonzero(state.params[n].grad) == 0 for n in NAMES)
    assert state.optimizer.step == 3


def test_a_sharded_state_needs_a_distributed_module():
    with pytest.raises(DistributedError, match=r"shard_state=True\) needs a distributed Module"):
        Optimizer(optimizer_model("adamw"), fake_module(make_state()), shard_state=True)
