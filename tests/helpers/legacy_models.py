"""Models, data and reference runs shared by the legacy TrainingSession tests."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.api import Module, Optimizer
from ort_torch_train.legacy import TrainingParameters, TrainingSession
from ort_torch_train.state.training_state import TrainingState


def F32(value: float) -> float:  # noqa: N802
    """``value`` rounded to float32."""
    return float(np.float32(value))


WEIGHTS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
LR = "Learning_Rate"


# ---- fixtures: a forward model with its loss as an output ---------------------------------------
def forward_model(seed: int = 0, activation: str = "Relu") -> onnx.ModelProto:
    """x -> Gemm -> Relu -> Gemm -> Mul(scale) -> Reshape(shape) -> logits; loss = CE(logits, y).

    ``scale`` is a scalar float initializer (1.0), ``shape`` an int64 one read at Reshape's
    stop-gradient input, ``unused.weight`` is read by no node. Outputs: [logits, loss]. ``activation``
    "Gelu": com.microsoft's Gelu instead of the Relu (what ``gelu_recompute`` recomputes); "Softmax":
    a Softmax and a Dropout (ratio 0.25, training) instead (what ``attn_dropout_recompute`` recomputes).
    """
    rng = np.random.default_rng(seed)
    init = lambda name, shape: numpy_helper.from_array(  # noqa: E731
        (rng.standard_normal(shape) * 0.4).astype(np.float32), name
    )
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        *_activation(activation),
        helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["z"], transB=1),
        helper.make_node("Mul", ["z", "scale"], ["zs"]),
        helper.make_node("Reshape", ["zs", "shape"], ["logits"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("y", TensorProto.INT64, ["N"]),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
        ],
        [
            init("fc1.weight", (6, 4)),
            init("fc1.bias", (6,)),
            init("fc2.weight", (3, 6)),
            init("fc2.bias", (3,)),
            numpy_helper.from_array(np.array(1.0, np.float32), "scale"),
            numpy_helper.from_array(np.array([-1, 3], np.int64), "shape"),
            init("unused.weight", (2,)),
        ],
    )
    opsets = [helper.make_opsetid("", 17), *([helper.make_opsetid("com.microsoft", 1)] if activation == "Gelu" else [])]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="tests")
    model.metadata_props.add(key="author", value="legacy-tests")
    return model


def _activation(kind: str) -> list[onnx.NodeProto]:
    """The nodes from ``h`` to ``r`` of ``forward_model``."""
    if kind == "Gelu":
        return [helper.make_node("Gelu", ["h"], ["r"], domain="com.microsoft")]
    if kind == "Softmax":
        return [
            helper.make_node("Softmax", ["h"], ["p"], axis=-1),
            helper.make_node("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.25, np.float32))),
            helper.make_node("Constant", [], ["training"], value=numpy_helper.from_array(np.array(True))),
            helper.make_node("Dropout", ["p", "ratio", "training"], ["r"]),
        ]
    return [helper.make_node("Relu", ["h"], ["r"])]


def batches(count: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((5, 4)).astype(np.float32), rng.integers(0, 3, 5).astype(np.int64)) for _ in range(count)
    ]


def lrs(count: int) -> list[float]:
    return [F32(0.05 - 0.004 * i) for i in range(count)]


def params_for(
    optimizer: str = "AdamOptimizer", weights=WEIGHTS, floats=None, ints=None, **settings
) -> TrainingParameters:
    p = TrainingParameters()
    p.loss_output_name = "loss"
    p.immutable_weights = {"Mul": [(1, 1.0)]}  # keep `scale` a constant: the trained set is WEIGHTS
    p.training_optimizer_name = optimizer
    p.optimizer_attributes_map = {w: dict(floats or {}) for w in weights}
    p.optimizer_int_attributes_map = {w: dict(ints or {}) for w in weights}
    for name, value in settings.items():
        setattr(p, name, value)
    return p


def session(parameters: TrainingParameters, activation: str = "Relu", **kwargs) -> TrainingSession:
    return TrainingSession(forward_model(activation=activation).SerializeToString(), parameters, **kwargs)


def train(sess: TrainingSession, data, rates, lr_name: str = LR) -> list[float]:
    return [
        float(sess.run(["loss"], {"x": x, "y": y, lr_name: np.array([lr], np.float32)})[0])
        for (x, y), lr in zip(data, rates)
    ]


def initial(name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in forward_model().graph.initializer if i.name == name)


# ---- the Module/Optimizer path on hand-built equivalent artifacts ------------------------------------
def training_artifact(forward: onnx.ModelProto) -> onnx.ModelProto:
    """The forward graph with WEIGHTS as graph inputs and the loss as first output."""
    model = onnx.ModelProto()
    model.CopyFrom(forward)
    graph = model.graph
    moved = [i for i in graph.initializer if i.name in WEIGHTS]
    kept = [i for i in graph.initializer if i.name not in WEIGHTS]
    graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in moved)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    logits, loss = list(graph.output)
    del graph.output[:]
    graph.output.extend([loss, logits])
    return model


def optimizer_artifact(op: str, **attributes) -> bytes:
    seq = lambda n: helper.make_tensor_sequence_value_info(n, TensorProto.FLOAT, None)  # noqa: E731
    inputs = [
        helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("step", TensorProto.INT64, [1]),
        seq("params"),
        seq("gradients"),
        seq("first_order_moments"),
    ]
    if op == "AdamWOptimizer":
        inputs.append(seq("second_order_moments"))
        node_inputs = ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"]
    else:
        node_inputs = ["learning_rate", "params", "gradients"]
    node = helper.make_node(op, node_inputs, ["flag"], domain="com.microsoft", **attributes)
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [1])
    graph = helper.make_graph([node], "optimizer", inputs, [flag])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def module_losses(optimizer_bytes: bytes, data, rates) -> tuple[list[float], dict[str, np.ndarray]]:
    forward = forward_model()
    state = TrainingState({n: torch.nn.Parameter(torch.from_numpy(initial(n).copy())) for n in WEIGHTS})
    model = training_artifact(forward)
    module = Module(model, state, model)
    optimizer = Optimizer(optimizer_bytes, module)
    losses = []
    for (x, y), lr in zip(data, rates):
        losses.append(float(module(x, y)[0]))
        optimizer.set_learning_rate(lr)
        optimizer.step()
        module.lazy_reset_grad()
    return losses, {n: state.params[n].detach().numpy().copy() for n in WEIGHTS}
