"""The optimizer moves the trainable parameters, gradients and moments into one flat buffer each: the
state keeps its tensors (now views of the buffers, values unchanged), one-graph and eager steps share
them, a device move makes new ones, and a state that cannot share one buffer is left alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from tests.helpers.paths import FIXTURES

MLP = FIXTURES / "mlp_ce_adamw_sched"


def _module(compile: bool) -> tuple[Module, Optimizer]:
    artifacts = MLP / "artifacts"
    module = Module(
        artifacts / "training_model.onnx",
        CheckpointState.load_checkpoint(artifacts / "checkpoint"),
        artifacts / "eval_model.onnx",
        compile=compile,
    )
    return module, Optimizer(artifacts / "optimizer_model.onnx", module)


def _batches():
    data = np.load(MLP / "data.npz")
    return [(data["x_train"][i], data["y_train"][i]) for i in range(len(data["x_train"]))]


def _snapshot(module: Module) -> dict[str, np.ndarray]:
    state = module.training_state
    values = {f"param/{n}": p.detach().numpy().copy() for n, p in state.params.items()}
    values.update({f"grad/{n}": p.grad.numpy().copy() for n, p in state.params.items() if p.grad is not None})
    values.update({f"{n}/{k}": m.numpy().copy() for n, ms in state.optimizer.momentums.items() for k, m in ms.items()})
    return values


def _shares(tensor: torch.Tensor, flat: torch.Tensor) -> bool:
    return tensor.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def test_flattening_keeps_the_state_tensors_and_values_as_views_of_the_buffers():
    module, optimizer = _module(compile=False)
    x, y = _batches()[0]
    module(x, y)  # gradients and moments exist and are not zero
    optimizer.step()
    module(x, y)
    state, names = module.training_state, module.trainable_parameter_names
    state.to("cpu")  # a new generation: the optimizer's buffers are stale, the next view flattens again
    before, params = _snapshot(module), dict(state.params)
    generation = state.generation
    flat = state.flat_view(names, ("momentum0", "momentum1"))
    assert flat is not None and state.generation == flat.generation == generation + 1
    assert all(state.params[n] is params[n] for n in names)  # the same Parameter objects
    for name in names:
        param = state.params[name]
        assert _shares(param, flat.params) and _shares(param.grad, flat.grads)
        assert [
            _shares(state.optimizer.momentums[name][k], m) for k, m in zip(("momentum0", "momentum1"), flat.moments)
        ] == [True, True]
    after = _snapshot(module)
    assert after.keys() == before.keys()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


@pytest.mark.compile
def test_one_graph_steps_then_eager_optimizer_steps_train_like_the_eager_loop():
    """Compiled steps flatten the state; eager optimizer steps after them update the same views."""
    batches = _batches()[:6]
    eager, eager_optimizer = _module(compile=False)
    mixed, mixed_optimizer = _module(compile=True)
    for step, (x, y) in enumerate(batches):
        eager(x, y)
        eager_optimizer.step()
        eager.lazy_reset_grad()
        if step < 3:
            mixed.step(mixed_optimizer, x, y)
        else:  # an eager optimizer step on the flattened state
            mixed.train_step([torch.from_numpy(x), torch.from_numpy(y)])
            mixed_optimizer.step()
            mixed.lazy_reset_grad()
    flat = mixed.training_state.flat
    assert flat is not None and flat.generation == mixed.training_state.generation
    expected, got = _snapshot(eager), _snapshot(mixed)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=0, atol=1e-5, err_msg=key)


@pytest.mark.compile
def test_a_device_move_makes_the_next_step_flatten_again():
    module, optimizer = _module(compile=True)
    x, y = _batches()[0]
    module.step(optimizer, x, y)
    first = module.training_state.flat
    module.to("cpu")
    module.step(optimizer, x, y)
    second = module.training_state.flat
    assert second is not first and second.generation == module.training_state.generation
    assert all(_shares(p, second.params) for p in module.training_state.params.values() if p.requires_grad)


def test_a_state_of_mixed_dtypes_is_left_alone():
    module, _ = _module(compile=False)
    state, names = module.training_state, module.trainable_parameter_names
    state.params[names[0]].data = state.params[names[0]].data.double()
    state.params[names[0]].grad = state.params[names[0]].grad.double()
    before = _snapshot(module)
    assert state.flat_view(names, ("momentum0", "momentum1")) is None  # the replaced tensors: a new generation
    generation = state.generation
    assert state.flat_view(names, ("momentum0", "momentum1")) is None
    assert state.generation == generation
    assert all(np.array_equal(v, _snapshot(module)[k]) for k, v in before.items())


@pytest.mark.compile
def test_tensors_replaced_behind_the_state_are_seen_by_the_next_step():
    """``param.data = ...`` and ``param.grad = ...`` (same values) between steps: training goes on as if
    nothing happened, eager and one-graph alike (the replaced tensors get new buffers)."""
    batches = _batches()[:6]
    for compile in (False, True):
        reference, reference_optimizer = _module(compile)
        replaced, replaced_optimizer = _module(compile)
        for step, (x, y) in enumerate(batches):
            if step == 3:
                for param in replaced.training_state.params.values():
                    param.data = param.data.clone()
                    param.grad = param.grad.clone()
            for module, optimizer in ((reference, reference_optimizer), (replaced, replaced_optimizer)):
                if compile:
                    module.step(optimizer, x, y)
                else:
                    module(x, y)
                    optimizer.step()
                    module.lazy_reset_grad()
        expected, got = _snapshot(reference), _snapshot(replaced)
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=f"compile={compile} {key}")
