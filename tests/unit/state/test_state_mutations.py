"""TrainingState owns every replacement of its tensors: each starts a new generation, values and objects
stay where the callers hold them, and tensors replaced behind its back are noticed."""

from __future__ import annotations

import pytest
import torch

from ort_torch_train.errors import CheckpointError
from ort_torch_train.state import OptimizerState, TrainingState


def _state(optimizer: bool = True) -> TrainingState:
    params = {
        "w": torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        "b": torch.nn.Parameter(torch.ones(3)),
        "frozen": torch.nn.Parameter(torch.full((2,), 5.0), requires_grad=False),
    }
    moments = {
        name: {"momentum0": torch.full_like(p, 0.5), "momentum1": torch.full_like(p, 0.25)}
        for name, p in params.items()
        if p.requires_grad
    }
    return TrainingState(params, optimizer=OptimizerState("group0", 3, 0.01, moments) if optimizer else None)


def test_freeze_drops_gradients_and_moments_and_casts_float32_parameters() -> None:
    state = _state()
    generation = state.generation
    state.freeze(["w"], torch.bfloat16)
    w = state.params["w"]
    assert not w.requires_grad and w.grad is None and w.dtype == torch.bfloat16
    assert torch.equal(w.float(), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert state.optimizer is not None and "w" not in state.optimizer.momentums and "b" in state.optimizer.momentums
    assert state.trainable_names() == ["b"] and state.generation == generation + 1


def test_add_trainable_keeps_file_order_and_gives_a_zero_gradient() -> None:
    state = _state()
    generation = state.generation
    held = state.params["b"]
    added = state.add_trainable("b", held.detach())  # a held tensor becomes a new trainable parameter in place
    new = state.add_trainable("lora", torch.zeros(4))
    assert list(state.params) == ["w", "b", "frozen", "lora"]
    assert state.params["b"] is added and added is not held and added.data_ptr() == held.data_ptr()
    assert new.requires_grad and new.grad is not None and torch.equal(new.grad, torch.zeros(4))
    assert state.generation == generation + 2


def test_follow_parameters_moves_moments_to_their_parameters_devices() -> None:
    state = _state()
    moment = state.optimizer.momentums["w"]["momentum0"]
    state.params["w"].data = state.params["w"].data.to(torch.float64)  # as nn.Module._apply replaces it
    generation = state.generation
    state.follow_parameters()
    assert state.generation == generation + 1
    assert state.optimizer.momentums["w"]["momentum0"] is moment  # moved in place: the same tensor object


def test_ensure_optimizer_makes_one_group_and_refuses_another_name() -> None:
    state = _state(optimizer=False)
    group = state.ensure_optimizer("group0", 0.001)
    assert group is state.optimizer and group == OptimizerState("group0", 0, 0.001, {})
    assert state.ensure_optimizer("group0", 0.5) is group  # kept, not replaced
    with pytest.raises(CheckpointError, match="ORT uses exactly one group, 'other'"):
        state.ensure_optimizer("other", 0.001)


def test_set_moments_replaces_them_and_counts_a_generation_only_when_flat_buffers_hold_them() -> None:
    state = _state()
    generation = state.generation
    state.set_moments({"w": {"momentum0": torch.zeros(2, 3)}})
    assert state.generation == generation and torch.equal(
        state.optimizer.momentums["w"]["momentum0"], torch.zeros(2, 3)
    )
    state.set_moments({"b": {"momentum0": torch.zeros(3)}}, only=True)
    assert list(state.optimizer.momentums) == ["b"]
    flattened = _state()
    flat = flattened.flat_view(["w", "b"], ("momentum0", "momentum1"))
    assert flat is not None and flattened.generation == flat.generation
    flattened.set_moments({"w": {"momentum0": torch.zeros(2, 3), "momentum1": torch.zeros(2, 3)}})
    assert flattened.generation == flat.generation + 1 and flattened.current_flat(["w", "b"]) is None


def test_set_moments_needs_an_optimizer_group() -> None:
    with pytest.raises(ValueError, match="no optimizer group"):
        _state(optimizer=False).set_moments({"w": {}})


def test_a_tensor_replaced_behind_the_states_back_makes_the_flat_buffers_stale() -> None:
    state = _state()
    flat = state.flat_view(["w", "b"])
    assert flat is not None and state.current_flat(["w", "b"]) is flat
    state.params["b"].grad = torch.zeros(3)  # not through the state
    assert state.current_flat(["w", "b"]) is None and state.generation == flat.generation + 1
    again = state.flat_view(["w", "b"])
    assert again is not None and again is not flat and again.generation == state.generation


def test_flat_views_are_asked_again_for_other_names_without_moving_twice() -> None:
    state = _state()
    flat = state.flat_view(["w", "b"], ("momentum0",))
    assert flat is not None
    assert state.flat_view(["w", "b"], ("momentum0",)) is flat  # the same buffers while they hold the tensors
    assert state.current_flat(["b", "w"]) is None  # another order is another layout


def test_set_moments_that_drops_moments_the_flat_buffers_hold_counts_a_generation() -> None:
    state = _state()
    flat = state.flat_view(["w"], ("momentum0", "momentum1"))
    assert flat is not None
    state.set_moments({"b": {"momentum0": torch.zeros(3), "momentum1": torch.zeros(3)}}, only=True)
    assert list(state.optimizer.momentums) == ["b"]
    assert state.generation == flat.generation + 1 and state.current_flat(["w"]) is None


def test_a_record_holds_the_moments_given_in_place_of_the_states_own() -> None:
    state = _state()
    slices = {"w": {"momentum0": torch.zeros(3)}}  # a rank's slice: not shaped like its parameter
    state.set_moments(slices, only=True)
    with pytest.raises(CheckpointError, match="'momentum0' of 'w'"):
        state.to_record(include_optimizer_state=True)
    whole = {"w": {"momentum0": torch.full((2, 3), 7.0)}}
    (group,) = state.to_record(include_optimizer_state=True, moments=whole).optimizer_groups
    assert (group.name, group.step, group.initial_learning_rate) == ("group0", 3, 0.01)
    assert list(group.momentums) == ["w"] and torch.equal(group.momentums["w"]["momentum0"], whole["w"]["momentum0"])
    assert state.optimizer.momentums["w"]["momentum0"] is slices["w"]["momentum0"]  # the state keeps its slices
    assert state.to_record(moments=whole).optimizer_groups == []  # asked for without the optimizer state
