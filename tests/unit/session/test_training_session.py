"""The C++-style TrainingSession: every method, and results equal to the Python API's."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from ort_torch_train.api import CheckpointState
from ort_torch_train.errors import InputError, ModelError
from ort_torch_train.session import (
    TrainingSession,
    load_checkpoint,
    load_checkpoint_from_buffer,
    save_checkpoint,
    set_seed,
)
from tests.helpers.corpus import loss_of


def _session(case, from_bytes: bool = False) -> TrainingSession:
    names = ["training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"]
    models = [case.artifact(n).read_bytes() if from_bytes else case.artifact(n) for n in names]
    return TrainingSession(load_checkpoint(case.artifact("checkpoint")), *models)


def _python_api_run(case, steps: int) -> tuple[list[float], float, np.ndarray]:
    module = case.module()
    optimizer = case.optimizer(module)
    losses = []
    for step in range(steps):
        optimizer.set_learning_rate(case.lr_before(step))
        losses.append(loss_of(module(*case.train_inputs(step))))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    eval_loss = loss_of(module(*case.eval_inputs()))
    return losses, eval_loss, module.get_contiguous_parameters().numpy()


@pytest.mark.slow
@pytest.mark.parametrize("from_bytes", [False, True], ids=["paths", "bytes"])
def test_training_loop_equals_python_api(case, from_bytes):
    if not case.deterministic:
        pytest.skip("random training step")
    session = _session(case, from_bytes)
    losses = []
    for step in range(5):
        session.SetLearningRate(case.lr_before(step))
        losses.append(loss_of(session.TrainStep(case.train_inputs(step))))
        session.OptimizerStep()
        session.LazyResetGrad()
    eval_loss = loss_of(session.EvalStep(case.eval_inputs()))
    expected_losses, expected_eval, expected_params = _python_api_run(case, 5)
    assert losses == expected_losses
    assert eval_loss == expected_eval
    np.testing.assert_array_equal(session.ToBuffer(False).numpy(), expected_params)


def test_names_and_counts(case):
    session = _session(case)
    train, evaluation = case.expected["train_mode"], case.expected["eval_mode"]
    assert session.InputNames(True) == train["input_names"]
    assert session.OutputNames(True) == train["output_names"]
    assert session.InputNames(False) == evaluation["input_names"]
    assert session.OutputNames(False) == evaluation["output_names"]
    assert session.training_model_input_count() == len(train["input_names"])
    assert session.eval_model_output_count() == len(evaluation["output_names"])
    assert session.training_model_input_name(0) == train["input_names"][0]
    assert session.eval_model_output_name(0) == evaluation["output_names"][0]
    with pytest.raises(IndexError, match="training model input index 9 out of range"):
        session.training_model_input_name(9)
    assert session.training_model_output_count() == len(train["output_names"])
    assert session.eval_model_input_count() == len(evaluation["input_names"])
    assert session.training_model_output_name(0) == train["output_names"][0]
    assert session.eval_model_input_name(0) == evaluation["input_names"][0]


def test_buffers_and_size_dispatch(case):
    session = _session(case)
    sizes = case.expected["parameters_size"]
    assert session.GetParametersSize(True) == sizes["trainable_only_True"]
    assert session.GetParametersSize(False) == sizes["trainable_only_False"]
    np.testing.assert_array_equal(
        session.CopyParametersToBuffer(True).numpy(), case.arrays["init_contiguous_trainable"]
    )
    session.FromBuffer(case.arrays["final_contiguous_all"])
    np.testing.assert_array_equal(session.ToBuffer(False).numpy(), case.arrays["final_contiguous_all"])
    session.FromBuffer(case.arrays["init_contiguous_trainable"])
    np.testing.assert_array_equal(session.ToBuffer(True).numpy(), case.arrays["init_contiguous_trainable"])
    session.CopyBufferToParameters(case.arrays["final_contiguous_trainable"], True)
    np.testing.assert_array_equal(session.ToBuffer(True).numpy(), case.arrays["final_contiguous_trainable"])
    with pytest.raises(InputError, match="Incorrect buffer size received"):
        session.FromBuffer(np.zeros(3, np.float32))


def test_nominal_checkpoint_completed_from_buffer(mlp_case):
    nominal = mlp_case.artifact("nominal_checkpoint")
    if not nominal.exists():
        pytest.skip("no nominal checkpoint")
    state = load_checkpoint_from_buffer(nominal.read_bytes())
    session = TrainingSession(state, mlp_case.artifact("training_model.onnx"), mlp_case.artifact("eval_model.onnx"))
    session.FromBuffer(mlp_case.arrays["init_contiguous_all"])  # all trainable: sizes coincide
    loss = loss_of(session.TrainStep(mlp_case.train_inputs(0)))
    assert abs(loss - mlp_case.expected["gradient_semantics"]["loss_call1"]) <= 1e-5


def test_linear_scheduler_and_learning_rate(mlp_case):
    session = _session(mlp_case)
    assert session.GetLearningRate() == pytest.approx(0.001)
    session.RegisterLinearLRScheduler(2, 10, 0.01)
    assert session.GetLearningRate() == 0.0
    lrs = []
    for step in range(4):
        session.TrainStep(mlp_case.train_inputs(step))
        session.OptimizerStep()
        session.SchedulerStep()
        lrs.append(session.GetLearningRate())
    np.testing.assert_allclose(lrs, [0.005, 0.01, 0.01 * 7 / 8, 0.01 * 6 / 8], rtol=1e-6)


def test_properties_and_parameters(mlp_case, tmp_path):
    session = _session(mlp_case)
    session.AddProperty("epoch", 7)
    session.AddProperty("note", "hello")
    assert session.GetProperty("epoch") == 7 and session.GetProperty("note") == "hello"
    name = mlp_case.param_names[0]
    dtype, shape = session.GetParameterTypeAndShape(name)
    assert dtype == np.float32 and shape == list(mlp_case.arrays[f"init__{name}"].shape)
    new_value = np.full(shape, 0.5, np.float32)
    session.UpdateParameter(name, new_value)
    np.testing.assert_array_equal(session.GetParameter(name).numpy(), new_value)
    with pytest.raises(Exception, match="shape mismatch"):
        session.UpdateParameter(name, np.zeros([s + 1 for s in shape], np.float32))
    path = tmp_path / "ckpt"
    save_checkpoint(session.checkpoint_state, path)
    reloaded = CheckpointState.load_checkpoint(path)
    assert reloaded.properties["epoch"] == 7
    np.testing.assert_array_equal(reloaded.parameters[name].data, new_value)


def test_set_seed_makes_dropout_reproducible():
    import torch

    set_seed(123)
    first = torch.nn.functional.dropout(torch.ones(100), 0.5)
    set_seed(123)
    assert torch.equal(first, torch.nn.functional.dropout(torch.ones(100), 0.5))


def test_export_from_a_session_built_from_bytes(case, tmp_path):
    session = _session(case, from_bytes=True)
    outputs = case.expected["inference_export"]["graph_output_names"]
    path = tmp_path / "inference.onnx"
    session.ExportModelForInferencing(path, outputs)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = dict(zip(case.expected["eval_mode"]["input_names"], case.eval_inputs()))
    ours = sess.run(outputs, {i.name: feeds[i.name] for i in sess.get_inputs()})[0]
    assert ours.shape[0] == case.eval_inputs()[0].shape[0]


def test_missing_optimizer_and_scheduler_are_clear(mlp_case):
    session = TrainingSession(
        load_checkpoint(mlp_case.artifact("checkpoint")), mlp_case.artifact("training_model.onnx")
    )
    with pytest.raises(ModelError, match="Optimizer model was not provided"):
        session.OptimizerStep()
    with pytest.raises(ModelError, match="No learning rate scheduler"):
        session.SchedulerStep()
    assert session.InputNames(False) == []
