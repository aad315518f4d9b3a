"""Reading the training and eval models: which inputs are user inputs, parameters, gradient buffers.

ORT's training graph takes ``[user inputs..., params..., <p>_grad.accumulation.buffer...,
lazy_reset_grad]`` and returns ``[loss, additional outputs..., <p>_grad.accumulation.out...]``;
the eval graph takes ``[user inputs..., params...]`` and returns ``[loss, additional outputs...]``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from ort_torch_train.errors import ModelError

from .ort_format import is_ort_format, read_ort_model, read_ort_model_file

GRAD_BUFFER_SUFFIX = "_grad.accumulation.buffer"
GRAD_OUTPUT_SUFFIX = "_grad.accumulation.out"
LAZY_RESET_GRAD = "lazy_reset_grad"

ModelSource = str | os.PathLike | bytes | onnx.ModelProto

NOT_ORT_FORMAT = "nor an ORT-format model (.ort FlatBuffers: no ORTM identifier)"


def file_head(path: str) -> bytes:
    """A file's first 8 bytes (fewer for a shorter file)."""
    with open(path, "rb") as file:
        return file.read(8)


def load_model(source: ModelSource, what: str, external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX or ORT-format (.ort) model from a path, bytes or a ModelProto; ``what`` names it in errors.

    The format is told by the content (an ORT-format model's FlatBuffers identifier), not the file's name.
    ``external_data=False`` leaves an ONNX file's external tensor data on disk (the initializers keep their
    references), so a model past 2 GB loads without its weights.
    """
    if isinstance(source, onnx.ModelProto):
        return source
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            if is_ort_format(source[:8]):
                return _with_text_names(read_ort_model(source, what), what)
            return _with_text_names(onnx.load_from_string(bytes(source)), what)
        if not os.path.exists(source):
            raise FileNotFoundError(f"{what} not found: {os.fspath(source)!r}")
        if os.path.isdir(source):
            raise IsADirectoryError(
                f"{what} path {os.fspath(source)!r} is a directory, expected an ONNX or ORT-format model file"
            )
        if is_ort_format(file_head(os.fspath(source))):
            return _with_text_names(read_ort_model_file(os.fspath(source), what), what)
        return _with_text_names(onnx.load(os.fspath(source), load_external_data=external_data), what)
    except (FileNotFoundError, IsADirectoryError, ModelError):
        raise
    except Exception as exc:
        named = what if isinstance(source, (bytes, bytearray, memoryview)) else f"{what} {os.fspath(source)!r}"
        raise ModelError(f"{named} is not a readable ONNX model ({exc}), {NOT_ORT_FORMAT}") from exc


def _with_text_names(model: onnx.ModelProto, what: str) -> onnx.ModelProto:
    """model, after checking that its graph's names decoded as text (protobuf leaves invalid UTF-8 as bytes)."""
    graph = model.graph
    names = [value.name for value in (*graph.input, *graph.output, *graph.initializer, *graph.value_info)]
    names += [
        name
        for node in graph.node
        for name in (
            node.name,
            node.op_type,
            node.domain,
            node.doc_string,
            *node.input,
            *node.output,
            *(attribute.name for attribute in node.attribute),
        )
    ]
    names += [
        graph.name,
        graph.doc_string,
        model.doc_string,
        model.producer_name,
        model.domain,
        *(opset.domain for opset in model.opset_import),
    ]
    for name in names:
        if not isinstance(name, str):
            raise ModelError(f"{what} holds a name that is not valid UTF-8: {name!r}")
    return model


def opsets_of(model: onnx.ModelProto) -> dict[str, int]:
    """Opset version per domain ('' for the default ONNX domain)."""
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


@dataclass(frozen=True)
class GraphLayout:
    """The roles of a graph's inputs and outputs."""

    user_inputs: tuple[str, ...]
    params: tuple[str, ...]  # parameter inputs in graph order
    user_outputs: tuple[str, ...]


def training_layout(model: onnx.ModelProto, param_names: Iterable[str]) -> GraphLayout:
    """Roles in a training graph; params are the inputs named in the checkpoint."""
    known = set(param_names)
    names = [value.name for value in model.graph.input]
    params = tuple(name for name in names if name in known)
    user_inputs = tuple(
        name
        for name in names
        if name not in known and not name.endswith(GRAD_BUFFER_SUFFIX) and name != LAZY_RESET_GRAD
    )
    outputs = tuple(value.name for value in model.graph.output if not value.name.endswith(GRAD_OUTPUT_SUFFIX))
    if not outputs:
        raise ModelError("training model has no user outputs (expected the loss first)")
    return GraphLayout(user_inputs, params, outputs)


def eval_layout(model: onnx.ModelProto, param_names: Iterable[str]) -> GraphLayout:
    """Roles in an eval graph."""
    known = set(param_names)
    names = [value.name for value in model.graph.input]
    return GraphLayout(
        user_inputs=tuple(name for name in names if name not in known),
        params=tuple(name for name in names if name in known),
        user_outputs=tuple(value.name for value in model.graph.output),
    )


def forward_graph(model: onnx.ModelProto, layout: GraphLayout, initializers: bool = True) -> onnx.GraphProto:
    """The part of ``model`` computing ``layout.user_outputs``; inputs ordered user inputs, then params.

    For a training graph this drops the gradient nodes, the accumulation buffers and lazy_reset_grad.
    Without ``initializers`` the part holds none (their data is not copied): the caller takes them from ``model``.
    """
    inputs_by_name = {value.name: value for value in model.graph.input}
    missing = [name for name in (*layout.user_inputs, *layout.params) if name not in inputs_by_name]
    if missing:
        raise ModelError(f"graph has no input named {missing[0]!r}")
    pruned = prune_graph(model.graph, layout.user_outputs, initializers)
    del pruned.input[:]
    pruned.input.extend(inputs_by_name[name] for name in (*layout.user_inputs, *layout.params))
    return pruned


def prune_graph(graph: onnx.GraphProto, outputs: Iterable[str], initializers: bool = True) -> onnx.GraphProto:
    """A copy of ``graph`` keeping only what ``outputs`` need (inputs without consumers dropped; the
    initializers they need unless ``initializers`` is False)."""
    outputs = list(outputs)
    producers = {output: index for index, node in enumerate(graph.node) for output in node.output if output}
    needed: set[str] = set()
    kept: set[int] = set()
    stack = list(outputs)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        index = producers.get(name)
        if index is not None and index not in kept:
            kept.add(index)
            node = graph.node[index]
            stack.extend(value for value in node.input if value)
            stack.extend(_subgraph_inputs(node))
    pruned = onnx.GraphProto(name=graph.name or "forward", doc_string=graph.doc_string)
    pruned.input.extend(value for value in graph.input if value.name in needed)
    value_infos = {value.name: value for value in (*graph.value_info, *graph.input, *graph.output)}
    for name in outputs:
        pruned.output.append(value_infos.get(name) or onnx.ValueInfoProto(name=name))
    pruned.node.extend(graph.node[i] for i in sorted(kept))
    if initializers:
        pruned.initializer.extend(init for init in graph.initializer if init.name in needed)
    pruned.value_info.extend(info for info in graph.value_info if info.name in needed and info.name not in outputs)
    return pruned


def _subgraph_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names read by a node's subgraphs (If/Loop/Scan bodies)."""
    names: list[str] = []
    for attribute in node.attribute:
        for subgraph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in subgraph.node:
                names.extend(value for value in inner.input if value)
    return names


def declared_shape(value: onnx.ValueInfoProto) -> tuple[int | str | None, ...] | None:
    """Declared dims (int, symbolic name, or None when unknown); None when the rank is unknown."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        else:
            dims.append(dim.dim_param or None)
    return tuple(dims)


def graph_without_initializers(graph: onnx.GraphProto) -> onnx.GraphProto:
    """A copy of ``graph`` with no initializers, made without copying their data."""
    copy = onnx.GraphProto()
    for field, value in graph.ListFields():
        if field.name != "initializer":
            copy_field(copy, field, value)
    return copy


def copy_field(target: object, field: object, value: object) -> None:
    """Set the protobuf ``field`` of ``target`` to ``value`` (a scalar, a message or a repeated field)."""
    name = field.name  # type: ignore[attr-defined]
    if isinstance(value, (str, bytes, int, float)):
        setattr(target, name, value)
    elif hasattr(value, "CopyFrom"):
        getattr(target, name).CopyFrom(value)
    else:  # a repeated field
        getattr(target, name).extend(value)
