"""A new optimizer algorithm is one record: a toy op defined and registered here is read from an optimizer model,
stepped by the OptimizerEngine and described by ``inspect`` with no change to the package."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import Tensor

from ort_torch_train.cli.main import main
from ort_torch_train.errors import ModelError
from ort_torch_train.optim.algorithm import (
    DEFAULT_LEARNING_RATE,
    AttributeValue,
    Hyperparameters,
    OptimizerAlgorithm,
    PreparedKernel,
)
from ort_torch_train.optim.compiled import FusedUpdate
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.optimizer_model import read_optimizer_model
from ort_torch_train.optim.registry import register, unregister
from ort_torch_train.state.training_state import TrainingState

DOMAIN, OP_TYPE = "com.example.test", "ScaledSGDTest"
INPUTS = ("learning_rate", "params", "gradients")


@dataclass(frozen=True)
class ScaledHyperparameters:
    """The learning rate and the node's ``scale``: ``w -= scale * lr * g``."""

    lr: float
    scale: float

    def with_learning_rate(self, lr: float) -> ScaledHyperparameters:
        return ScaledHyperparameters(lr, self.scale)


def scaled_sgd(params: list[Tensor], grads: list[Tensor], negative_step: float | Tensor) -> None:
    """``w += (-scale * lr) * g``, one tensor at a time."""
    for w, g in zip(params, grads):
        w.add_(g * negative_step)


def _own(hyperparameters: Hyperparameters) -> ScaledHyperparameters:
    assert isinstance(hyperparameters, ScaledHyperparameters)
    return hyperparameters


def _hyperparameters(attributes: Mapping[str, AttributeValue]) -> ScaledHyperparameters:
    return ScaledHyperparameters(DEFAULT_LEARNING_RATE, float(attributes["scale"]))


def _update(
    params: list[Tensor],
    grads: list[Tensor],
    moments: list[list[Tensor]],
    h: Hyperparameters,
    step: int,
    kernel: PreparedKernel,
) -> None:
    with torch.no_grad():
        scaled_sgd(params, grads, -_own(h).scale * h.lr)


SCALED_SGD = OptimizerAlgorithm(
    op_type=OP_TYPE,
    domain=DOMAIN,
    display_name="ScaledSGD",
    name="scaled_sgd",
    graph_inputs=INPUTS,
    node_inputs=INPUTS,
    attribute_defaults={"scale": 2.0},
    make_hyperparameters=_hyperparameters,
    reported=lambda h: {"scale": _own(h).scale},
    stored_moments=(),
    updated_moments=(),
    implementations=("single",),
    default_implementation=lambda params, grads, moments: "single",
    update=_update,
    scratch_lists=0,
    fused_update=lambda h, clip_max_norm: FusedUpdate(scaled_sgd, (), clip_max_norm),
    step_scalars=lambda h, step: -_own(h).scale * h.lr,
    elementwise=True,
)


@pytest.fixture
def registered() -> Iterator[OptimizerAlgorithm]:
    register(SCALED_SGD)
    try:
        yield SCALED_SGD
    finally:
        unregister(SCALED_SGD)


def scaled_sgd_model(**attributes: float) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1])] + [
        helper.make_tensor_sequence_value_info(name, TensorProto.FLOAT, None) for name in INPUTS[1:]
    ]
    node = helper.make_node(OP_TYPE, list(INPUTS), ["updated"], domain=DOMAIN, **attributes)
    flag = helper.make_tensor_value_info("updated", TensorProto.BOOL, [1])
    graph = helper.make_graph([node], "optimizer", inputs, [flag])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(DOMAIN, 1)])


def test_a_new_op_is_read_and_stepped_through_its_record(registered: OptimizerAlgorithm) -> None:
    spec = read_optimizer_model(scaled_sgd_model(scale=3.0))
    assert spec.algorithm is registered and spec.hyperparameters == ScaledHyperparameters(DEFAULT_LEARNING_RATE, 3.0)
    assert read_optimizer_model(scaled_sgd_model()).hyperparameters == ScaledHyperparameters(DEFAULT_LEARNING_RATE, 2.0)

    gen = torch.Generator().manual_seed(0)
    state = TrainingState({name: torch.nn.Parameter(torch.randn(3, 2, generator=gen)) for name in ("w", "b")})
    engine = OptimizerEngine(spec, state, ["w", "b"])
    assert sorted(state.optimizer.momentums) == ["b", "w"] and not any(state.optimizer.momentums.values())
    engine.set_learning_rate(0.5)
    before = {name: param.detach().clone() for name, param in state.params.items()}
    for param in state.params.values():
        param.grad.copy_(torch.randn(param.shape, generator=gen))
    assert engine.step() and engine.completed_steps == 1
    for name, param in state.params.items():
        assert torch.equal(param.detach(), before[name] + param.grad * np.float32(-1.5))
    assert engine.fused_update() == FusedUpdate(scaled_sgd, (), None)
    assert float(engine.next_step_scalars()) == -1.5
    with pytest.raises(ValueError, match="implementation for scaled_sgd must be one of \\('single',\\)"):
        OptimizerEngine(spec, state, ["w", "b"], implementation="foreach")


def test_inspect_reports_the_records_name_and_hyperparameters(
    registered: OptimizerAlgorithm, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    onnx.save(scaled_sgd_model(scale=3.0), tmp_path / "optimizer_model.onnx")
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["optimizer"] == {
        "algorithm": "ScaledSGD",
        "hyperparameters": {"scale": 3.0, "clip_max_norm": None, "has_update_signal": False},
    }


def test_an_unregistered_op_is_refused_and_a_taken_op_type_is_not_registered_twice() -> None:
    message = "expected one com.microsoft AdamWOptimizer or SGDOptimizerV2 node"
    with pytest.raises(ModelError, match=f"unsupported node .*{DOMAIN}::{OP_TYPE}.*{message}"):
        read_optimizer_model(scaled_sgd_model())
    register(SCALED_SGD)
    try:
        with pytest.raises(ValueError, match=f"{DOMAIN}::{OP_TYPE} is registered already"):
            register(SCALED_SGD)
    finally:
        unregister(SCALED_SGD)
    with pytest.raises(ValueError, match="is not registered"):
        unregister(SCALED_SGD)
