"""Read an ORT optimizer model (``optimizer_model.onnx`` from ``generate_artifacts``) into a spec.

Accepted layout (onnxblock's ``AdamW``/``SGD``, checked by ORT's ``training_api/optimizer.cc``):
graph inputs ``learning_rate: float[1]``, ``step: int64[1]``, then the float tensor sequences
``params``, ``gradients``, ``first_order_moments`` (+ ``second_order_moments`` for AdamW), then
optionally one ``bool[1]`` update-signal input; one ``com.microsoft`` ``AdamWOptimizer`` or
``SGDOptimizerV2`` node, optionally fed by one ``InplaceClipGradNorm`` node on ``gradients``;
one output, the node's updated flag. Anything else raises ``ModelError``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import onnx
from onnx import AttributeProto, TensorProto

from ort_torch_train.errors import ModelError
from ort_torch_train.optim.adamw import AdamWHyperparameters
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.sgd import SGDHyperparameters

MS_DOMAIN = "com.microsoft"
ADAMW_OP, SGD_OP, CLIP_OP = "AdamWOptimizer", "SGDOptimizerV2", "InplaceClipGradNorm"
ADAMW_INPUTS = ("learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments")
SGD_INPUTS = ADAMW_INPUTS[:5]
# Node input slots: AdamW(lr, step, params, grads, m1, m2[, update_signal]); SGD(lr, params, grads[, signal]).
_NODE_INPUTS = {ADAMW_OP: ADAMW_INPUTS, SGD_OP: ("learning_rate", "params", "gradients")}
# Defaults of missing attributes: ORT fills them from the op SCHEMA (training_op_defs.cc) before the
# kernel reads them, so weight_decay defaults to 0.01 (the schema), not 0 (adamwbase.h). Observed
# with onnxruntime-training 1.19.2; floats are float32 attributes.
_ADAMW_DEFAULTS = {
    "alpha": to_float32(0.9),
    "beta": to_float32(0.999),
    "epsilon": to_float32(1e-8),
    "weight_decay": to_float32(0.01),
    "adam_mode": 0,
    "correct_bias": 1,
}
_CLIP_DEFAULTS = {"max_norm": 1.0, "norm_type": "fro"}


@dataclass(frozen=True)
class OptimizerSpec:
    """What an optimizer model asks for. beta1/beta2 are ORT's ``alpha``/``beta`` attributes."""

    kind: str  # "adamw" | "sgd"
    beta1: float = _ADAMW_DEFAULTS["alpha"]
    beta2: float = _ADAMW_DEFAULTS["beta"]
    epsilon: float = _ADAMW_DEFAULTS["epsilon"]
    weight_decay: float = _ADAMW_DEFAULTS["weight_decay"]
    adam_mode: int = 0
    correct_bias: bool = True
    clip_max_norm: float | None = None
    has_update_signal: bool = False

    @property
    def momentum_names(self) -> tuple[str, ...]:
        """Per-parameter optimizer state names, as ORT stores them in the checkpoint."""
        return ("momentum0", "momentum1") if self.kind == "adamw" else ("momentum0",)

    def hyperparameters(self, learning_rate: float) -> AdamWHyperparameters | SGDHyperparameters:
        """The kernel's hyperparameters: this model's attributes and ``learning_rate``."""
        if self.kind == "sgd":
            return SGDHyperparameters(learning_rate)
        return AdamWHyperparameters(
            lr=learning_rate,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.epsilon,
            weight_decay=self.weight_decay,
            adam_mode=self.adam_mode,
            correct_bias=self.correct_bias,
        )


def read_optimizer_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> OptimizerSpec:
    """Parse an optimizer model given as a path, serialized bytes or a ModelProto."""
    return parse_optimizer_graph(_load(model).graph)


def parse_optimizer_graph(graph: onnx.GraphProto) -> OptimizerSpec:
    """Validate an optimizer graph against ORT's layout and return its spec."""
    if graph.initializer or graph.sparse_initializer:
        names = [t.name for t in graph.initializer] + [t.values.name for t in graph.sparse_initializer]
        raise ModelError(f"optimizer model: expected no initializers; found {names}")
    optimizer_node, clip_node = _split_nodes(graph.node)
    kind = "adamw" if optimizer_node.op_type == ADAMW_OP else "sgd"
    has_update_signal = _check_graph_inputs(graph, optimizer_node, kind)
    gradients = _check_clip_node(clip_node, optimizer_node) if clip_node is not None else "gradients"
    _check_node_inputs(optimizer_node, gradients, has_update_signal)
    _check_graph_outputs(graph, optimizer_node)
    clip_max_norm = _clip_max_norm(clip_node) if clip_node is not None else None
    if kind == "sgd":
        _attributes(optimizer_node, {})
        return OptimizerSpec("sgd", clip_max_norm=clip_max_norm, has_update_signal=has_update_signal)
    attrs = _adamw_attributes(optimizer_node)
    return OptimizerSpec(
        "adamw",
        beta1=attrs["alpha"],
        beta2=attrs["beta"],
        epsilon=attrs["epsilon"],
        weight_decay=attrs["weight_decay"],
        adam_mode=attrs["adam_mode"],
        correct_bias=bool(attrs["correct_bias"]),
        clip_max_norm=clip_max_norm,
        has_update_signal=has_update_signal,
    )


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise ModelError(f"optimizer model: the bytes given are not a serialized ONNX model ({exc})") from exc
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelError(f"optimizer model: no such file {path!r}")
        try:
            return onnx.load(path)
        except Exception as exc:
            raise ModelError(f"optimizer model: {path!r} is not a readable ONNX model ({exc})") from exc
    raise TypeError(f"optimizer model must be a path, bytes or onnx.ModelProto; got {type(model).__name__}")


def _split_nodes(nodes) -> tuple[onnx.NodeProto, onnx.NodeProto | None]:
    found = [f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in nodes]
    expected = f"one {MS_DOMAIN} {ADAMW_OP} or {SGD_OP} node, optionally preceded by one {CLIP_OP} node"
    for node in nodes:
        if node.domain != MS_DOMAIN or node.op_type not in (ADAMW_OP, SGD_OP, CLIP_OP):
            raise ModelError(
                f"optimizer model: unsupported node {node.name!r} "
                f"({node.domain or 'ai.onnx'}::{node.op_type}); expected {expected}"
            )
    if [n.op_type for n in nodes] not in ([ADAMW_OP], [SGD_OP], [CLIP_OP, ADAMW_OP], [CLIP_OP, SGD_OP]):
        raise ModelError(f"optimizer model: expected {expected}; found nodes {found}")
    return nodes[-1], (nodes[0] if len(nodes) == 2 else None)


def _check_graph_inputs(graph: onnx.GraphProto, node: onnx.NodeProto, kind: str) -> bool:
    """Check names and types of the graph inputs; return whether an update-signal input is present."""
    expected = ADAMW_INPUTS if kind == "adamw" else SGD_INPUTS
    names = [i.name for i in graph.input]
    signal = _update_signal_name(node)
    if names != list(expected) and names != [*expected, signal]:
        optional = f" (+ the update signal {signal!r})" if signal else ""
        raise ModelError(
            f"optimizer model: unexpected graph inputs for {node.op_type}; expected "
            f"{list(expected)}{optional}, found {names}"
        )
    for value in graph.input:
        _check_input_type(value, signal)
    return len(names) > len(expected)


def _update_signal_name(node: onnx.NodeProto) -> str:
    slot = len(_NODE_INPUTS[node.op_type])
    inputs = _present_inputs(node)
    return inputs[slot] if len(inputs) > slot else ""


def _present_inputs(node: onnx.NodeProto) -> list[str]:
    """The node's inputs without trailing empty names (ONNX's way to leave optional inputs out)."""
    inputs = list(node.input)
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def _check_input_type(value: onnx.ValueInfoProto, signal: str) -> None:
    tensor_type = {"learning_rate": TensorProto.FLOAT, "step": TensorProto.INT64, signal: TensorProto.BOOL}
    t = value.type
    if value.name in tensor_type:
        expected = f"a {TensorProto.DataType.Name(tensor_type[value.name]).lower()} tensor"
        ok = t.WhichOneof("value") == "tensor_type" and t.tensor_type.elem_type == tensor_type[value.name]
    else:
        expected = "a sequence of float tensors"
        ok = (
            t.WhichOneof("value") == "sequence_type"
            and t.sequence_type.elem_type.WhichOneof("value") == "tensor_type"
            and t.sequence_type.elem_type.tensor_type.elem_type == TensorProto.FLOAT
        )
    if not ok:
        raise ModelError(
            f"optimizer model: graph input {value.name!r} must be {expected}; found "
            f"{onnx.helper.printable_type(t) or 'no type'}"
        )


def _check_clip_node(clip: onnx.NodeProto, optimizer: onnx.NodeProto) -> str:
    """Check that the clip node reads ``gradients`` and feeds the optimizer; return its output name."""
    if list(clip.input) != ["gradients"] or len(clip.output) != 1:
        raise ModelError(
            f"optimizer model: {CLIP_OP} must take exactly ['gradients'] and produce one "
            f"output; found inputs {list(clip.input)}, outputs {list(clip.output)}"
        )
    return clip.output[0]


def _check_node_inputs(node: onnx.NodeProto, gradients: str, has_update_signal: bool) -> None:
    expected = [gradients if name == "gradients" else name for name in _NODE_INPUTS[node.op_type]]
    found = _present_inputs(node)
    if (
        found[: len(expected)] != expected
        or len(found) > len(expected) + 1
        or (len(found) > len(expected) and not has_update_signal)
    ):
        raise ModelError(
            f"optimizer model: {node.op_type} inputs must be {expected} (+ an update-signal graph input); found {found}"
        )


def _check_graph_outputs(graph: onnx.GraphProto, node: onnx.NodeProto) -> None:
    outputs = [o.name for o in graph.output]
    if len(node.output) != 1 or outputs != [node.output[0]]:
        raise ModelError(
            f"optimizer model: expected {node.op_type} to have one output, the graph's only "
            f"output (the updated flag); found node outputs {list(node.output)}, "
            f"graph outputs {outputs}"
        )


def _adamw_attributes(node: onnx.NodeProto) -> dict:
    attrs = _attributes(node, _ADAMW_DEFAULTS)
    for name in ("alpha", "beta"):
        if not 0.0 <= attrs[name] < 1.0:
            raise ModelError(f"optimizer model: {ADAMW_OP} attribute {name} must be in [0, 1); found {attrs[name]}")
    for name in ("epsilon", "weight_decay"):
        if not (math.isfinite(attrs[name]) and attrs[name] >= 0.0):
            raise ModelError(
                f"optimizer model: {ADAMW_OP} attribute {name} must be finite and >= 0; found {attrs[name]}"
            )
    for name in ("adam_mode", "correct_bias"):
        if attrs[name] not in (0, 1):
            raise ModelError(f"optimizer model: {ADAMW_OP} attribute {name} must be 0 or 1; found {attrs[name]}")
    if attrs["adam_mode"] == 0 and attrs["correct_bias"] != 1:
        raise ModelError(
            f"optimizer model: {ADAMW_OP} with adam_mode 0 (torch AdamW) requires correct_bias 1; found correct_bias 0"
        )
    return attrs


def _clip_max_norm(node: onnx.NodeProto) -> float:
    attrs = _attributes(node, _CLIP_DEFAULTS)
    if attrs["norm_type"] != "fro":
        raise ModelError(f"optimizer model: {CLIP_OP} supports norm_type 'fro' only; found {attrs['norm_type']!r}")
    if not (math.isfinite(attrs["max_norm"]) and attrs["max_norm"] >= 0.0):
        raise ModelError(
            f"optimizer model: {CLIP_OP} attribute max_norm must be finite and >= 0; found {attrs['max_norm']}"
        )
    return attrs["max_norm"]


def _attributes(node: onnx.NodeProto, defaults: dict) -> dict:
    """Read ``node``'s attributes over ``defaults``; the default's Python type fixes the ONNX type."""
    onnx_types = {float: AttributeProto.FLOAT, int: AttributeProto.INT, str: AttributeProto.STRING}
    values = dict(defaults)
    for attr in node.attribute:
        if attr.name not in defaults:
            raise ModelError(
                f"optimizer model: {node.op_type} has unknown attribute {attr.name!r}; "
                f"expected some of {sorted(defaults)}"
            )
        expected_type = onnx_types[type(defaults[attr.name])]
        if attr.type != expected_type:
            raise ModelError(
                f"optimizer model: {node.op_type} attribute {attr.name!r} must be "
                f"{AttributeProto.AttributeType.Name(expected_type)}; found "
                f"{AttributeProto.AttributeType.Name(attr.type)}"
            )
        value = onnx.helper.get_attribute_value(attr)
        values[attr.name] = value.decode() if isinstance(value, bytes) else value
    return values
