"""A session's own operators (``adapters.OpLibrary``, ``Module(custom_ops=)``): converted for that session
only, run on paths whose parameters are frozen, refused where a trainable parameter's gradient must flow
through an op the library cannot differentiate, and let through when it can."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ort_torch_train.adapters.common import attributes, result
from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.artifacts import LossType, generate_artifacts
from ort_torch_train.errors import UnsupportedOperatorError

ALPHA = 0.5
X = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
TARGET = np.linspace(0.0, 1.0, 8, dtype=np.float32).reshape(4, 2)


class ScaledSquare(torch.nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x * x


class Squares:
    """``ott.test::ScaledSquare``, differentiable or not."""

    def __init__(self, differentiable: bool) -> None:
        self.gradients = differentiable

    def converter(self, domain: str, op_type: str) -> Any:
        if (domain, op_type) != ("ott.test", "ScaledSquare"):
            return None
        return lambda node, graph, context: result(ScaledSquare(attributes(node)["alpha"]), node)

    def differentiable(self, domain: str, op_type: str) -> bool:
        return self.gradients


def artifacts(folder: Path, trainable: list[str], frozen: list[str]) -> Path:
    """y = ScaledSquare(x + F) @ W + B: ScaledSquare made from a Mul stand-in after generation."""
    nodes = [
        helper.make_node("Add", ["x", "F"], ["shifted"], name="shift"),
        helper.make_node("Mul", ["shifted", "shifted"], ["square"], name="square"),
        helper.make_node("MatMul", ["square", "W"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "B"], ["y"], name="add"),
    ]
    rng = np.random.default_rng(0)
    shapes = {"F": (3,), "W": (3, 2), "B": (2,)}
    initializers = [
        onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in shapes.items()
    ]
    graph = helper.make_graph(
        nodes,
        "library",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    generate_artifacts(
        model, requires_grad=trainable, frozen_params=frozen, loss=LossType.MSELoss, artifact_directory=folder
    )
    for name in ("training_model.onnx", "eval_model.onnx"):
        edited = onnx.load(folder / name)
        square = next(node for node in edited.graph.node if node.name == "square")
        square.domain, square.op_type = "ott.test", "ScaledSquare"
        del square.input[1:]
        square.attribute.append(helper.make_attribute("alpha", ALPHA))
        edited.opset_import.append(helper.make_opsetid("ott.test", 1))
        onnx.save(edited, folder / name)
    return folder


def module(folder: Path, library: Any) -> Module:
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    return Module(folder / "training_model.onnx", state, folder / "eval_model.onnx", custom_ops=library)


def test_an_op_behind_frozen_parameters_trains_equal_to_torch(tmp_path: Path) -> None:
    folder = artifacts(tmp_path, ["W", "B"], ["F"])
    trained = module(folder, Squares(differentiable=False))
    params = {name: torch.tensor(trained.training_state.parameter(name).detach().numpy()) for name in "FWB"}
    trained.train()
    loss = trained(X, TARGET)
    y = ALPHA * (torch.from_numpy(X) + params["F"]) ** 2 @ params["W"] + params["B"]
    assert float(loss) == pytest.approx(float(torch.mean((y - torch.from_numpy(TARGET)) ** 2)), rel=1e-6)
    trained.eval()
    assert float(trained(X, TARGET)) == pytest.approx(float(loss), rel=1e-6)


def test_a_trainable_parameter_upstream_is_refused_naming_op_and_parameter(tmp_path: Path) -> None:
    folder = artifacts(tmp_path, ["F", "W", "B"], [])
    with pytest.raises(UnsupportedOperatorError, match=r"ott.test::ScaledSquare \(node 'square'\).*parameter 'F'"):
        module(folder, Squares(differentiable=False))
    differentiable = module(folder, Squares(differentiable=True))  # a library that can differentiate trains F
    differentiable.train()
    differentiable(X, TARGET)
    assert differentiable.training_state.parameter("F").grad is not None


def test_the_op_is_unknown_without_the_library_and_a_wrong_library_is_named(tmp_path: Path) -> None:
    folder = artifacts(tmp_path, ["W", "B"], ["F"])
    with pytest.raises(UnsupportedOperatorError, match="ScaledSquare of domain ott.test"):
        module(folder, None)
    with pytest.raises(TypeError, match="custom_ops: expected an ort_torch_train.adapters.OpLibrary"):
        module(folder, object())
