"""Loss blocks compute torch's losses; custom blocks compose; outputs and loss inputs are wired as ORT's."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from ort_torch_train.artifacts import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    L1Loss,
    LossType,
    MSELoss,
    OptimType,
    build_artifacts,
    generate,
    generate_artifacts,
)
from tests.helpers.artifacts_support import WeightedMseL1
from tests.unit.artifacts.test_artifacts_errors import PARAMS, linear_model

RNG = np.random.default_rng(1)
X = RNG.standard_normal((4, 3)).astype(np.float32)
TARGET = RNG.standard_normal((4, 2)).astype(np.float32)
BINARY = (RNG.random((4, 2)) > 0.5).astype(np.float32)
LABELS = np.array([0, 1, 1, 0], np.int64)


def run_eval_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The eval model under onnxruntime, the parameters fed from the base model's initializers."""
    params = {init.name: onnx.numpy_helper.to_array(init) for init in linear_model().graph.initializer}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {**feeds, **params})


def logits() -> torch.Tensor:
    params = {init.name: torch.tensor(onnx.numpy_helper.to_array(init)) for init in linear_model().graph.initializer}
    return F.linear(torch.from_numpy(X), params["fc.weight"], params["fc.bias"])


CASES = [
    (LossType.MSELoss, "target", TARGET, lambda y: F.mse_loss(y, torch.from_numpy(TARGET))),
    (LossType.L1Loss, "target", TARGET, lambda y: F.l1_loss(y, torch.from_numpy(TARGET))),
    (
        LossType.BCEWithLogitsLoss,
        "target",
        BINARY,
        lambda y: F.binary_cross_entropy_with_logits(y, torch.from_numpy(BINARY)),
    ),
    (LossType.CrossEntropyLoss, "labels", LABELS, lambda y: F.cross_entropy(y, torch.from_numpy(LABELS))),
    (MSELoss(reduction="sum"), "target", TARGET, lambda y: F.mse_loss(y, torch.from_numpy(TARGET), reduction="sum")),
    (L1Loss(reduction="none"), "target", TARGET, lambda y: F.l1_loss(y, torch.from_numpy(TARGET), reduction="none")),
    (
        BCEWithLogitsLoss(weight=np.array([2.0, 0.5], np.float32), pos_weight=np.array([3.0, 1.0], np.float32)),
        "target",
        BINARY,
        lambda y: F.binary_cross_entropy_with_logits(
            y, torch.from_numpy(BINARY), weight=torch.tensor([2.0, 0.5]), pos_weight=torch.tensor([3.0, 1.0])
        ),
    ),
    (
        CrossEntropyLoss(weight=np.array([0.3, 1.7], np.float32), ignore_index=1),
        "labels",
        LABELS,
        lambda y: F.cross_entropy(y, torch.from_numpy(LABELS), weight=torch.tensor([0.3, 1.7]), ignore_index=1),
    ),
    (
        WeightedMseL1(),
        "target",
        TARGET,
        lambda y: 0.7 * F.mse_loss(y, torch.from_numpy(TARGET)) + 0.3 * F.l1_loss(y, torch.from_numpy(TARGET)),
    ),
]


@pytest.mark.parametrize(
    ("loss", "target_name", "target", "torch_loss"),
    CASES,
    ids=[type(c[0]).__name__ if not isinstance(c[0], LossType) else c[0].name for c in CASES],
)
def test_loss_blocks_compute_torch_losses(loss, target_name, target, torch_loss) -> None:
    artifacts = build_artifacts(linear_model(), PARAMS, None, loss)
    eval_model = artifacts.eval_model
    assert [v.name for v in eval_model.graph.input] == ["input", target_name, *PARAMS]
    (value, *_) = run_eval_model(eval_model, {"input": X, target_name: target})
    np.testing.assert_allclose(value, torch_loss(logits()).numpy(), rtol=1e-5, atol=1e-6)


def test_target_and_labels_inputs_as_ort_declares_them() -> None:
    mse = build_artifacts(linear_model(), PARAMS, None, LossType.MSELoss).eval_model
    ce = build_artifacts(linear_model(), PARAMS, None, LossType.CrossEntropyLoss).eval_model
    assert mse.graph.input[1] == helper.make_tensor_value_info("target", TensorProto.FLOAT, ["batch", 2])
    assert ce.graph.input[1] == helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"])
    assert [n.op_type for n in mse.graph.node] == ["Gemm", "Sub", "Pow", "ReduceMean"]
    assert [n.op_type for n in ce.graph.node] == ["Gemm", "SoftmaxCrossEntropyLoss"]


def test_custom_loss_trains_with_torch_gradients(tmp_path: Path) -> None:
    """A composed loss (0.7 MSE + 0.3 L1): our Module's loss and gradients equal torch autograd's."""
    from ort_torch_train.api.checkpoint_state import CheckpointState
    from ort_torch_train.api.module import Module

    generate_artifacts(
        linear_model(), requires_grad=PARAMS, loss=WeightedMseL1(), optimizer=OptimType.SGD, artifact_directory=tmp_path
    )
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    loss = module(X, TARGET)

    weight = torch.from_numpy(np.array(state.parameters["fc.weight"].data)).requires_grad_()
    bias = torch.from_numpy(np.array(state.parameters["fc.bias"].data)).requires_grad_()
    y = F.linear(torch.from_numpy(X), weight, bias)
    expected = 0.7 * F.mse_loss(y, torch.from_numpy(TARGET)) + 0.3 * F.l1_loss(y, torch.from_numpy(TARGET))
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-6)
    np.testing.assert_allclose(state.parameters["fc.weight"].grad, weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(state.parameters["fc.bias"].grad, bias.grad.numpy(), rtol=1e-5, atol=1e-7)


def two_output_model() -> onnx.ModelProto:
    """linear_model plus a second output, probs = Softmax(logits)."""
    model = linear_model()
    model.graph.node.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=-1))
    model.graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 2]))
    return model


def test_additional_outputs_follow_the_loss() -> None:
    artifacts = build_artifacts(
        two_output_model(),
        PARAMS,
        None,
        LossType.CrossEntropyLoss,
        additional_output_names=["probs", "logits"],
        loss_input_names=["logits"],
    )
    for model in (artifacts.eval_model, artifacts.training_model):
        assert [v.name for v in model.graph.output][1:] == ["probs", "logits"]
    loss, probs, raw = run_eval_model(artifacts.eval_model, {"input": X, "labels": LABELS})
    np.testing.assert_allclose(raw, logits().numpy(), rtol=1e-6, atol=1e-7)  # onnxruntime's GEMM differs per CPU ISA
    np.testing.assert_allclose(probs, torch.softmax(logits(), -1).numpy(), rtol=1e-5)
    np.testing.assert_allclose(loss, F.cross_entropy(logits(), torch.from_numpy(LABELS)).item(), rtol=1e-5)


def test_without_loss_every_model_output_is_an_output_and_the_first_is_the_loss() -> None:
    artifacts = build_artifacts(two_output_model(), PARAMS, None, loss=None)
    assert [v.name for v in artifacts.eval_model.graph.output] == ["logits", "probs"]


def test_frozen_and_other_initializers() -> None:
    """Frozen params are inputs too (initializer order); unselected initializers stay constants."""
    model = linear_model()
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(2, np.float32), "scale"))
    model.graph.node.append(helper.make_node("Mul", ["logits", "scale"], ["scaled"]))
    model.graph.output[0].name = "scaled"
    artifacts = build_artifacts(model, ["fc.bias"], ["fc.weight"], LossType.MSELoss)
    assert [v.name for v in artifacts.eval_model.graph.input] == ["input", "target", "fc.weight", "fc.bias"]
    assert [i.name for i in artifacts.eval_model.graph.initializer] == ["scale", "onnx::pow_exponent::3"]
    assert list(artifacts.checkpoint.trainable) == ["fc.bias"]
    assert list(artifacts.checkpoint.frozen) == ["fc.weight"]


def test_names_restart_for_every_call() -> None:
    first = build_artifacts(linear_model(), PARAMS, None, LossType.MSELoss, OptimType.AdamW)
    second = build_artifacts(linear_model(), PARAMS, None, LossType.MSELoss, OptimType.AdamW)
    assert first.eval_model == second.eval_model and first.optimizer_model == second.optimizer_model
    assert first.eval_model.graph.output[0].name == "onnx::reducemean_output::6"


def test_ir_version_is_capped_for_ort_1_19() -> None:
    model = linear_model()
    model.ir_version = 14  # what onnx 1.23's make_model writes
    artifacts = build_artifacts(model, PARAMS, None, LossType.MSELoss, OptimType.AdamW)
    assert artifacts.eval_model.ir_version == artifacts.training_model.ir_version == 10
    assert artifacts.optimizer_model.ir_version == 10


def test_an_opset_newer_than_ort_1_19_draws_a_warning_once(monkeypatch) -> None:
    monkeypatch.setattr(generate, "_WARNED_VERSIONS", set())  # as in a fresh process
    model = linear_model(opset=22)
    model.ir_version = 11
    with pytest.warns(UserWarning, match="opset 22"):
        artifacts = build_artifacts(model, PARAMS, None, LossType.MSELoss, OptimType.SGD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second model of the same versions: no second warning
        build_artifacts(linear_model(opset=22), PARAMS, None, LossType.MSELoss, OptimType.SGD)
    assert artifacts.eval_model.ir_version == 10  # IR 10 already covers opset 22
    assert [(o.domain, o.version) for o in artifacts.optimizer_model.opset_import] == [("com.microsoft", 1), ("", 21)]
