"""read_optimizer_model: ORT's optimizer-model layout accepted, everything else refused with ModelError."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ort_torch_train.errors import ModelError
from ort_torch_train.optim.adamw import ADAMW_ALGORITHM, AdamWHyperparameters
from ort_torch_train.optim.algorithm import DEFAULT_LEARNING_RATE
from ort_torch_train.optim.optimizer_model import OptimizerSpec, read_optimizer_model
from ort_torch_train.optim.sgd import SGD_ALGORITHM, SGDHyperparameters

F32 = lambda x: float(np.float32(x))  # noqa: E731
ADAMW_NAMES = ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"]
HF_ATTRS = dict(alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=0.0, adam_mode=1, correct_bias=1)


def seq(name, elem=TensorProto.FLOAT):
    return helper.make_tensor_sequence_value_info(name, elem, None)


def graph_inputs(names):
    types = {
        "learning_rate": (TensorProto.FLOAT, [1]),
        "step": (TensorProto.INT64, [1]),
        "update_signal": (TensorProto.BOOL, [1]),
    }
    return [helper.make_tensor_value_info(n, *types[n]) if n in types else seq(n) for n in names]


def build(
    kind="adamw",
    attrs=None,
    clip=None,
    inputs=None,
    node_inputs=None,
    extra_nodes=(),
    signal=False,
    outputs=("flag",),
    initializers=(),
    domain="com.microsoft",
) -> onnx.ModelProto:
    """An optimizer model in ORT's layout, with any part overridable."""
    op = "AdamWOptimizer" if kind == "adamw" else "SGDOptimizerV2"
    names = ADAMW_NAMES if kind == "adamw" else ADAMW_NAMES[:5]
    grads = "gradients"
    nodes = []
    if clip is not None:
        nodes.append(
            helper.make_node("InplaceClipGradNorm", ["gradients"], ["clipped"], domain="com.microsoft", **clip)
        )
        grads = "clipped"
    default_node_inputs = (
        ["learning_rate", "step", "params", grads, "first_order_moments", "second_order_moments"]
        if kind == "adamw"
        else ["learning_rate", "params", grads]
    )
    node_inputs = list(node_inputs or default_node_inputs) + (["update_signal"] if signal else [])
    attrs = HF_ATTRS if attrs is None and kind == "adamw" else (attrs or {})
    nodes.append(helper.make_node(op, node_inputs, ["flag"], domain=domain, **attrs))
    nodes.extend(extra_nodes)
    inputs = graph_inputs(list(inputs or names) + (["update_signal"] if signal else []))
    outs = [helper.make_tensor_value_info(o, TensorProto.BOOL, [1]) for o in outputs]
    return helper.make_model(helper.make_graph(nodes, "optimizer", inputs, outs, initializer=list(initializers)))


# ---- accepted -------------------------------------------------------------------------------------
def test_ort_made_optimizer_models(corpus_case):
    spec = read_optimizer_model(corpus_case / "artifacts" / "optimizer_model.onnx")
    graphs = json.loads((corpus_case / "graphs.json").read_text())
    node = graphs["optimizer_model.onnx"]["com_microsoft_nodes"][0]
    if node["op_type"] == "SGDOptimizerV2":
        assert spec.algorithm is SGD_ALGORITHM and spec.algorithm.stored_moments == ("momentum0",)
        assert spec.algorithm.updated_moments == ()
    else:
        a = node["attributes"]
        hyperparameters = AdamWHyperparameters(
            lr=DEFAULT_LEARNING_RATE,
            beta1=a["alpha"],
            beta2=a["beta"],
            eps=a["epsilon"],
            weight_decay=a["weight_decay"],
            adam_mode=a["adam_mode"],
            correct_bias=bool(a["correct_bias"]),
        )
        assert spec == OptimizerSpec(ADAMW_ALGORITHM, hyperparameters)
        assert (hyperparameters.adam_mode, hyperparameters.correct_bias, hyperparameters.eps) == (1, True, F32(1e-6))
        assert spec.algorithm.stored_moments == spec.algorithm.updated_moments == ("momentum0", "momentum1")
    assert spec.clip_max_norm is None and not spec.has_update_signal


def test_missing_attributes_take_ort_schema_defaults():
    """ORT fills missing attributes from the op schema: weight_decay 0.01, not the kernel's 0."""
    spec = read_optimizer_model(build(attrs={}))
    assert spec == OptimizerSpec(
        ADAMW_ALGORITHM,
        AdamWHyperparameters(
            lr=DEFAULT_LEARNING_RATE,
            beta1=F32(0.9),
            beta2=F32(0.999),
            eps=F32(1e-8),
            weight_decay=F32(0.01),
            adam_mode=0,
            correct_bias=True,
        ),
    )


def test_clip_update_signal_and_sources(tmp_path):
    spec = read_optimizer_model(build(clip=dict(max_norm=2.5), signal=True))
    assert spec.clip_max_norm == 2.5 and spec.has_update_signal
    assert read_optimizer_model(build(clip={})).clip_max_norm == 1.0
    sgd = build("sgd", clip=dict(max_norm=0.5, norm_type="fro"))
    assert read_optimizer_model(sgd) == OptimizerSpec(
        SGD_ALGORITHM, SGDHyperparameters(DEFAULT_LEARNING_RATE), clip_max_norm=0.5
    )
    path = tmp_path / "optimizer_model.onnx"
    onnx.save(sgd, path)
    assert read_optimizer_model(path) == read_optimizer_model(str(path)) == read_optimizer_model(path.read_bytes())
    trailing_empty = build(
        node_inputs=["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments", ""]
    )
    assert not read_optimizer_model(trailing_empty).has_update_signal


# ---- refused --------------------------------------------------------------------------------------
def _node(op, inputs, outputs, domain="com.microsoft", **attrs):
    return helper.make_node(op, inputs, outputs, domain=domain, **attrs)


REJECTED = {
    "another op": (
        build(extra_nodes=[_node("Identity", ["flag"], ["copy"], domain="")]),
        "unsupported node .*ai.onnx::Identity",
    ),
    "default-domain optimizer": (build(domain=""), "unsupported node .*ai.onnx::AdamWOptimizer"),
    "two optimizer nodes": (
        build(extra_nodes=[_node("AdamWOptimizer", ADAMW_NAMES, ["flag2"], **HF_ATTRS)]),
        "found nodes .*AdamWOptimizer.*AdamWOptimizer",
    ),
    "adamw and sgd": (
        build(extra_nodes=[_node("SGDOptimizerV2", ["learning_rate", "params", "gradients"], ["f2"])]),
        "expected one com.microsoft AdamWOptimizer or SGDOptimizerV2 node",
    ),
    "clip after the optimizer": (
        build(extra_nodes=[_node("InplaceClipGradNorm", ["gradients"], ["c"])]),
        "found nodes .*AdamWOptimizer.*InplaceClipGradNorm",
    ),
    "no nodes": (helper.make_model(helper.make_graph([], "g", graph_inputs(ADAMW_NAMES), [])), "found nodes \\[\\]"),
    "unexpected graph input": (build(inputs=ADAMW_NAMES + ["extra"]), "unexpected graph inputs .*found .*'extra'"),
    "missing graph input": (build(inputs=ADAMW_NAMES[:5]), "unexpected graph inputs for AdamWOptimizer"),
    "sgd with second moments": (build("sgd", inputs=ADAMW_NAMES), "unexpected graph inputs for SGDOptimizerV2"),
    "reordered graph inputs": (build(inputs=["step", "learning_rate"] + ADAMW_NAMES[2:]), "unexpected graph inputs"),
    "swapped node inputs": (
        build(
            node_inputs=["learning_rate", "step", "gradients", "params", "first_order_moments", "second_order_moments"]
        ),
        "AdamWOptimizer inputs must be",
    ),
    "signal not a graph input": (build(node_inputs=ADAMW_NAMES + ["flag_in"]), "AdamWOptimizer inputs must be"),
    "extra graph output": (build(outputs=("flag", "params")), "graph outputs \\['flag', 'params'\\]"),
    "initializer": (
        build(initializers=[helper.make_tensor("eps", TensorProto.FLOAT, [1], [1e-6])]),
        "expected no initializers; found \\['eps'\\]",
    ),
    "mode 0 without bias correction": (
        build(attrs=dict(adam_mode=0, correct_bias=0)),
        "adam_mode 0 .* requires correct_bias 1",
    ),
    "adam_mode 2": (build(attrs=dict(adam_mode=2)), "adam_mode must be 0 or 1; found 2"),
    "correct_bias 3": (build(attrs=dict(adam_mode=1, correct_bias=3)), "correct_bias must be 0 or 1; found 3"),
    "beta1 of 1": (build(attrs=dict(alpha=1.0)), r"alpha must be in \[0, 1\); found 1.0"),
    "negative beta2": (build(attrs=dict(beta=-0.5)), r"beta must be in \[0, 1\)"),
    "negative epsilon": (build(attrs=dict(epsilon=-1e-8)), "epsilon must be finite and >= 0"),
    "NaN weight decay": (build(attrs=dict(weight_decay=float("nan"))), "weight_decay must be finite and >= 0"),
    "unknown attribute": (build(attrs=dict(max_norm=1.0)), "unknown attribute 'max_norm'"),
    "attribute of the wrong type": (build(attrs=dict(adam_mode=1.0)), "'adam_mode' must be INT; found FLOAT"),
    "sgd attribute": (build("sgd", attrs=dict(alpha=0.9)), "SGDOptimizerV2 has unknown attribute 'alpha'"),
    "clip norm_type": (build(clip=dict(norm_type="l1")), "norm_type 'fro' only; found 'l1'"),
    "clip negative max_norm": (build(clip=dict(max_norm=-1.0)), "max_norm must be finite and >= 0"),
}


@pytest.mark.parametrize("case", list(REJECTED))
def test_rejected_layouts(case):
    model, message = REJECTED[case]
    with pytest.raises(ModelError, match=message):
        read_optimizer_model(model)


@pytest.mark.parametrize(
    "name,elem,message",
    [
        ("learning_rate", "int64", "'learning_rate' must be a float tensor; found"),
        ("step", "float", "'step' must be a int64 tensor"),
        ("params", "tensor", "'params' must be a sequence of float tensors"),
        ("gradients", "double-seq", "'gradients' must be a sequence of float tensors"),
    ],
)
def test_rejected_input_types(name, elem, message):
    model = build()
    index = ADAMW_NAMES.index(name)
    replacement = {
        "int64": helper.make_tensor_value_info(name, TensorProto.INT64, [1]),
        "float": helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]),
        "tensor": helper.make_tensor_value_info(name, TensorProto.FLOAT, None),
        "double-seq": seq(name, TensorProto.DOUBLE),
    }[elem]
    model.graph.input[index].CopyFrom(replacement)
    with pytest.raises(ModelError, match=message):
        read_optimizer_model(model)


def test_clip_must_read_the_gradients():
    model = build(clip={})
    model.graph.node[0].input[0] = "params"
    with pytest.raises(ModelError, match=r"InplaceClipGradNorm must take exactly \['gradients'\]"):
        read_optimizer_model(model)


def test_bad_sources(tmp_path):
    with pytest.raises(ModelError, match="no such file"):
        read_optimizer_model(tmp_path / "missing.onnx")
    with pytest.raises(ModelError, match="not a serialized ONNX model"):
        read_optimizer_model(b"\xff\x00 not onnx")
    (tmp_path / "garbage.onnx").write_bytes(b"\xff\x00 not onnx")
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        read_optimizer_model(tmp_path / "garbage.onnx")
    with pytest.raises(TypeError, match="path, bytes or onnx.ModelProto; got int"):
        read_optimizer_model(42)
