"""LossScaler is torch.amp.GradScaler over gradient buffers: the same scales, skips and unscaled
gradients as GradScaler driving a torch optimizer, with its state kept in the checkpoint's properties."""

from __future__ import annotations

import torch

from ort_torch_train.state.loss_scale import GROWTH_TRACKER_PROPERTY, LOSS_SCALE_PROPERTY, LossScaler
from ort_torch_train.state.training_state import TrainingState

# per step: the gradient the backward of the scaled loss produced (inf: an fp16 overflow)
GRADIENTS = [[1.0, 2.0], [float("inf"), 1.0], [3.0, 4.0], [5.0, 6.0], [float("nan"), 0.0], [7.0, 8.0], [1.0, 1.0]]


def _state() -> TrainingState:
    return TrainingState({"w": torch.nn.Parameter(torch.zeros(2))})


def test_same_scales_skips_and_gradients_as_grad_scaler_on_a_torch_optimizer() -> None:
    settings = dict(init_scale=1024.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)
    ours = LossScaler(_state(), **settings)
    weight = torch.nn.Parameter(torch.zeros(2))
    reference = torch.amp.GradScaler("cpu", **settings)
    optimizer = torch.optim.SGD([weight], lr=1.0)
    skips = []
    for values in GRADIENTS:
        grad = torch.tensor(values)
        reference.scale(torch.ones(()))
        weight.grad = grad.clone()
        before = weight.detach().clone()
        reference.step(optimizer)
        stepped = not torch.equal(weight.detach(), before)  # every finite gradient here moves the weight
        reference.update()
        ours.scaled(torch.ones(()))
        ours_grad = grad.clone()
        assert ours.unscale_and_update([ours_grad]) == stepped
        skips.append(not stepped)
        assert ours.get_scale() == reference.get_scale()
        if stepped:
            assert torch.equal(ours_grad, weight.grad)
    assert skips == [False, True, False, False, True, False, False]
    assert ours.state.properties[LOSS_SCALE_PROPERTY] == reference.get_scale()
    assert ours.state.properties[GROWTH_TRACKER_PROPERTY] == reference.state_dict()["_growth_tracker"]


def test_state_is_read_from_and_written_to_the_properties() -> None:
    state = _state()
    state.properties[LOSS_SCALE_PROPERTY] = 512.0
    state.properties[GROWTH_TRACKER_PROPERTY] = 1
    scaler = LossScaler(state, growth_interval=2)
    assert scaler.get_scale() == 512.0 and float(scaler.scaled(torch.tensor(2.0))) == 1024.0
    assert scaler.unscale_and_update([torch.tensor([512.0])])  # the second clean step: grows
    assert state.properties[LOSS_SCALE_PROPERTY] == 1024.0 and state.properties[GROWTH_TRACKER_PROPERTY] == 0
    static = LossScaler(state, init_scale=8.0, dynamic=False)
    assert float(static.scale) == 8.0
    assert not static.unscale_and_update([torch.tensor([float("inf")])])
    assert static.get_scale() == 8.0
    assert state.properties[LOSS_SCALE_PROPERTY] == 1024.0  # a static scale is not saved
