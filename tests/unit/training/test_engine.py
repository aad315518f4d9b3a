"""TrainingEngine on its own, without a face: ORT's gradient semantics, the eval graph, the optimizer check,
the parameter buffer and a device move."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from ort_torch_train.errors import ModelError
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.optimizer_model import read_optimizer_model
from ort_torch_train.state import TrainingState
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.options import EngineOptions
from tests.helpers.paths import FIXTURES

CASE = FIXTURES / "mlp_ce_adamw_sched"


def _engine(eval_model: bool = True) -> TrainingEngine:
    artifacts = CASE / "artifacts"
    return TrainingEngine(
        onnx.load(artifacts / "training_model.onnx"),
        TrainingState.load(artifacts / "checkpoint"),
        onnx.load(artifacts / "eval_model.onnx") if eval_model else None,
        EngineOptions.of(),
    )


def _batch(index: int = 0) -> list[torch.Tensor]:
    data = np.load(CASE / "data.npz")
    return [torch.from_numpy(data["x_train"][index]), torch.from_numpy(data["y_train"][index])]


def _grads(engine: TrainingEngine) -> list[torch.Tensor]:
    return [engine.training_state.params[name].grad.clone() for name in engine.trainable_parameter_names]


def test_gradients_accumulate_until_a_lazy_reset_and_the_next_step_overwrites_them() -> None:
    engine = _engine()
    engine.train_step(_batch(0))
    first = _grads(engine)
    engine.train_step(_batch(0))
    assert all(torch.allclose(twice, 2 * once, rtol=1e-6, atol=0) for twice, once in zip(_grads(engine), first))
    engine.lazy_reset_grad()
    engine.train_step(_batch(0))
    assert all(torch.equal(again, once) for again, once in zip(_grads(engine), first))


def test_the_eval_step_takes_no_gradient_and_needs_the_eval_model() -> None:
    engine = _engine()
    data = np.load(CASE / "data.npz")
    before = _grads(engine)
    (loss,) = engine.eval_step([torch.from_numpy(data["x_eval"]), torch.from_numpy(data["y_eval"])])
    assert loss.dim() == 0 and not loss.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(_grads(engine), before))
    with pytest.raises(ModelError, match="Eval model was not provided"):
        _engine(eval_model=False).eval_step(_batch(0)[:1])


def test_train_and_update_refuses_an_optimizer_of_another_state() -> None:
    engine, other = _engine(), _engine()
    spec = read_optimizer_model(CASE / "artifacts" / "optimizer_model.onnx")
    foreign = OptimizerEngine(spec, other.training_state, other.trainable_parameter_names)
    with pytest.raises(ValueError, match="must update this module's training state"):
        engine.train_and_update(_batch(0), foreign)
    own = OptimizerEngine(spec, engine.training_state, engine.trainable_parameter_names)
    before = [p.detach().clone() for p in own.parameters]
    engine.train_and_update(_batch(0), own)
    assert own.completed_steps == 1 and not any(torch.equal(p, q) for p, q in zip(own.parameters, before))


def test_the_parameter_buffer_round_trips_in_the_training_graphs_order() -> None:
    engine = _engine()
    buffer = engine.contiguous_parameters()
    assert buffer.dtype == torch.float32 and buffer.numel() == engine.parameters_size(trainable_only=False)
    engine.copy_buffer_to_parameters(torch.zeros_like(buffer), trainable_only=False)
    assert not engine.contiguous_parameters().any()
    engine.copy_buffer_to_parameters(buffer, trainable_only=False)
    assert torch.equal(engine.contiguous_parameters(), buffer)


def test_tensors_moved_starts_a_new_generation_and_the_next_step_runs_on_the_new_tensors() -> None:
    engine = _engine()
    engine.train_step(_batch(0))
    state = engine.training_state
    generation = state.generation
    for param in state.params.values():  # as nn.Module._apply replaces them
        param.data = param.data.clone()
        if param.grad is not None:
            param.grad = param.grad.clone()
    engine.tensors_moved()
    assert state.generation > generation
    engine.lazy_reset_grad()
    engine.train_step(_batch(1))
    assert all(state.params[name].grad.abs().sum() > 0 for name in engine.trainable_parameter_names)


def test_the_compiled_steps_parameter_views_follow_tensors_replaced_behind_the_state() -> None:
    """Without flat buffers (mixed dtypes) a compiled step takes ``_parameter_views``: ``param.data = ...`` and
    ``param.grad = ...`` leave the state's generation alone, yet the next views are the new tensors."""
    engine = _engine()
    engine.train_step(_batch(0))
    state, name = engine.training_state, engine.trainable_parameter_names[0]
    trainable, _, grads = engine._parameter_views()
    assert engine._parameter_views()[0] is trainable  # nothing replaced: the same lists
    generation = state.generation
    param = state.params[name]
    param.data = param.data.clone()
    trainable, _, grads = engine._parameter_views()
    assert state.generation == generation and trainable[0].data_ptr() == param.data_ptr()
    param.grad = param.grad.clone()
    assert engine._parameter_views(check_tensors=False)[2] is grads  # flat buffers check their own
    assert engine._parameter_views()[2][0] is param.grad
