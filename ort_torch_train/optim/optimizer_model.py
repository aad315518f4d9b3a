"""Read an ORT optimizer model (``optimizer_model.onnx`` from ``generate_artifacts``) into a spec.

Accepted layout (onnxblock's ``AdamW``/``SGD``, checked by ORT's ``training_api/optimizer.cc``): the
graph inputs the algorithm's record names (``learning_rate: float[1]``, ``step: int64[1]``, then float
tensor sequences such as ``params``, ``gradients``, ``first_order_moments``), then optionally one
``bool[1]`` update-signal input; one node of a registered algorithm (``optim/registry.py``: ORT's
``com.microsoft`` ``AdamWOptimizer`` and ``SGDOptimizerV2``), optionally fed by one
``InplaceClipGradNorm`` node on ``gradients``; one output, the node's updated flag. Anything else
raises ``ModelError``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import AttributeProto, TensorProto

from ort_torch_train.errors import ModelError
from ort_torch_train.graph.layout import NOT_ORT_FORMAT, file_head
from ort_torch_train.graph.ort_format import is_ort_format, read_ort_model, read_ort_model_file
from ort_torch_train.optim.algorithm import MS_DOMAIN, AttributeValue, Hyperparameters, OptimizerAlgorithm
from ort_torch_train.optim.registry import algorithms, find_algorithm

CLIP_OP = "InplaceClipGradNorm"
_CLIP_DEFAULTS: dict[str, AttributeValue] = {"max_norm": 1.0, "norm_type": "fro"}


@dataclass(frozen=True)
class OptimizerSpec:
    """What an optimizer model asks for: its algorithm, the kernel's hyperparameters from the node's
    attributes (at the default learning rate: the model takes the learning rate as an input), the
    gradient clip's max norm (None: no clip) and whether an update-signal input gates the update."""

    algorithm: OptimizerAlgorithm
    hyperparameters: Hyperparameters
    clip_max_norm: float | None = None
    has_update_signal: bool = False


def read_optimizer_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> OptimizerSpec:
    """Parse an optimizer model given as a path, serialized bytes or a ModelProto."""
    return parse_optimizer_graph(load_optimizer_model(model).graph)


def parse_optimizer_graph(graph: onnx.GraphProto) -> OptimizerSpec:
    """Validate an optimizer graph against ORT's layout and return its spec."""
    if graph.initializer or graph.sparse_initializer:
        names = [t.name for t in graph.initializer] + [t.values.name for t in graph.sparse_initializer]
        raise ModelError(f"optimizer model: expected no initializers; found {names}")
    optimizer_node, clip_node, algorithm = _split_nodes(graph.node)
    has_update_signal = _check_graph_inputs(graph, optimizer_node, algorithm)
    gradients = _check_clip_node(clip_node, optimizer_node) if clip_node is not None else "gradients"
    _check_node_inputs(optimizer_node, algorithm, gradients, has_update_signal)
    _check_graph_outputs(graph, optimizer_node)
    clip_max_norm = _clip_max_norm(clip_node) if clip_node is not None else None
    hyperparameters = algorithm.make_hyperparameters(_attributes(optimizer_node, algorithm.attribute_defaults))
    return OptimizerSpec(algorithm, hyperparameters, clip_max_norm, has_update_signal)


def load_optimizer_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """The optimizer model given as a path, serialized bytes (ONNX or ORT format) or a ModelProto; ModelError
    for a missing or unreadable one, TypeError for another kind of value."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        if is_ort_format(model[:8]):
            return read_ort_model(model, "optimizer model")
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise ModelError(
                f"optimizer model: the bytes given are not a serialized ONNX model ({exc}), {NOT_ORT_FORMAT}"
            ) from exc
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelError(f"optimizer model: no such file {path!r}")
        if is_ort_format(file_head(path)):
            return read_ort_model_file(path, "optimizer model")
        try:
            return onnx.load(path)
        except Exception as exc:
            raise ModelError(
                f"optimizer model: {path!r} is not a readable ONNX model ({exc}), {NOT_ORT_FORMAT}"
            ) from exc
    raise TypeError(f"optimizer model must be a path, bytes or onnx.ModelProto; got {type(model).__name__}")


def _split_nodes(nodes: Sequence[onnx.NodeProto]) -> tuple[onnx.NodeProto, onnx.NodeProto | None, OptimizerAlgorithm]:
    """The optimizer node, the clip node before it (if any) and the optimizer node's algorithm."""
    found = [f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in nodes]
    expected = f"one {_registered_nodes()} node, optionally preceded by one {CLIP_OP} node"
    for node in nodes:
        if not _is_clip(node) and find_algorithm(node.domain, node.op_type) is None:
            raise ModelError(
                f"optimizer model: unsupported node {node.name!r} "
                f"({node.domain or 'ai.onnx'}::{node.op_type}); expected {expected}"
            )
    algorithm = find_algorithm(nodes[-1].domain, nodes[-1].op_type) if nodes else None
    if algorithm is None or len(nodes) > 2 or not all(_is_clip(node) for node in nodes[:-1]):
        raise ModelError(f"optimizer model: expected {expected}; found nodes {found}")
    return nodes[-1], (nodes[0] if len(nodes) == 2 else None), algorithm


def _is_clip(node: onnx.NodeProto) -> bool:
    return node.domain == MS_DOMAIN and node.op_type == CLIP_OP


def _registered_nodes() -> str:
    """The registered algorithms' nodes, e.g. "com.microsoft AdamWOptimizer or SGDOptimizerV2"."""
    by_domain: dict[str, list[str]] = {}
    for algorithm in algorithms():
        by_domain.setdefault(algorithm.domain, []).append(algorithm.op_type)
    return " or ".join(f"{domain} {' or '.join(op_types)}" for domain, op_types in by_domain.items())


def _check_graph_inputs(graph: onnx.GraphProto, node: onnx.NodeProto, algorithm: OptimizerAlgorithm) -> bool:
    """Check names and types of the graph inputs; return whether an update-signal input is present."""
    expected = algorithm.graph_inputs
    names = [i.name for i in graph.input]
    signal = _update_signal_name(node, algorithm)
    if names != list(expected) and names != [*expected, signal]:
        optional = f" (+ the update signal {signal!r})" if signal else ""
        raise ModelError(
            f"optimizer model: unexpected graph inputs for {node.op_type}; expected "
            f"{list(expected)}{optional}, found {names}"
        )
    for value in graph.input:
        _check_input_type(value, signal)
    return len(names) > len(expected)


def _update_signal_name(node: onnx.NodeProto, algorithm: OptimizerAlgorithm) -> str:
    slot = len(algorithm.node_inputs)
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


def _check_node_inputs(
    node: onnx.NodeProto, algorithm: OptimizerAlgorithm, gradients: str, has_update_signal: bool
) -> None:
    expected = [gradients if name == "gradients" else name for name in algorithm.node_inputs]
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


def _clip_max_norm(node: onnx.NodeProto) -> float:
    attrs = _attributes(node, _CLIP_DEFAULTS)
    if attrs["norm_type"] != "fro":
        raise ModelError(f"optimizer model: {CLIP_OP} supports norm_type 'fro' only; found {attrs['norm_type']!r}")
    max_norm = float(attrs["max_norm"])
    if not (math.isfinite(max_norm) and max_norm >= 0.0):
        raise ModelError(f"optimizer model: {CLIP_OP} attribute max_norm must be finite and >= 0; found {max_norm}")
    return max_norm


def _attributes(node: onnx.NodeProto, defaults: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
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
