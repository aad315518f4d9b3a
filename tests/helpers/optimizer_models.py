"""Small optimizer fixtures for the unit tests: a state of three trainable parameters (and a frozen one),
gradients for it, ORT-layout optimizer models and a stand-in module for ``Optimizer``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from onnx import TensorProto, helper

from ort_torch_train.state.training_state import TrainingState

F32 = lambda x: float(np.float32(x))  # noqa: E731
NAMES = ["fc2.weight", "fc1.bias", "fc1.weight"]  # training-graph order, not the state's


def make_state(seed: int = 0, frozen: bool = True) -> TrainingState:
    gen = torch.Generator().manual_seed(seed)
    shapes = {"fc1.weight": (8, 4), "fc1.bias": (8,), "fc2.weight": (3, 8), "frozen.weight": (2, 2)}
    params = {
        n: torch.nn.Parameter(torch.randn(s, generator=gen), requires_grad=n != "frozen.weight")
        for n, s in shapes.items()
        if frozen or n != "frozen.weight"
    }
    return TrainingState(params)


def set_grads(state: TrainingState, seed: int) -> None:
    gen = torch.Generator().manual_seed(1000 + seed)
    for name in NAMES:
        state.params[name].grad.copy_(torch.randn(state.params[name].shape, generator=gen))


def optimizer_model(kind: str = "adamw", clip: float | None = None, signal: bool = False, **attrs) -> bytes:
    seq = lambda n: helper.make_tensor_sequence_value_info(n, TensorProto.FLOAT, None)  # noqa: E731
    names = ["learning_rate", "step", "params", "gradients", "first_order_moments"]
    names += ["second_order_moments"] if kind == "adamw" else []
    inputs = [
        helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("step", TensorProto.INT64, [1]),
    ] + [seq(n) for n in names[2:]]
    nodes, grads = [], "gradients"
    if clip is not None:
        nodes.append(
            helper.make_node("InplaceClipGradNorm", ["gradients"], ["clipped"], domain="com.microsoft", max_norm=clip)
        )
        grads = "clipped"
    op_inputs = (
        ["learning_rate", "step", "params", grads, "first_order_moments", "second_order_moments"]
        if kind == "adamw"
        else ["learning_rate", "params", grads]
    )
    if signal:
        inputs.append(helper.make_tensor_value_info("update_signal", TensorProto.BOOL, [1]))
        op_inputs.append("update_signal")
    op = "AdamWOptimizer" if kind == "adamw" else "SGDOptimizerV2"
    nodes.append(helper.make_node(op, op_inputs, ["flag"], domain="com.microsoft", **attrs))
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [1])
    graph = helper.make_graph(nodes, "optimizer", inputs, [flag])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def fake_module(state: TrainingState) -> SimpleNamespace:
    return SimpleNamespace(
        training_state=state,
        trainable_parameter_names=list(NAMES),
        data_parallel=None,
        pipeline=None,
        precision=None,
        update_program=lambda optimizer_model: None,  # no package: the optimizer's own kernel
    )
