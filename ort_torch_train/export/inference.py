"""Export for inference, as ORT's ``export_model_for_inferencing`` does it.

From the eval model: the outputs become ``graph_output_names`` (any value of the eval graph),
nodes and inputs they do not need are removed, and the parameters are baked in as initializers
with their current values, streamed to ONNX external data (``<model>.data``) when they pass
``external_data.EXTERNAL_DATA_THRESHOLD`` (protobuf's 2 GB). An eval model with LoRA adapters is
merged first (``ort_torch_train.lora.export``), then exported here like any other.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from ort_torch_train.dtypes import tensor_to_proto
from ort_torch_train.errors import ModelError
from ort_torch_train.export.external_data import is_external, placeholder, write_model
from ort_torch_train.export.outputs import exportable_output_names
from ort_torch_train.graph.layout import prune_graph

# Current onnxruntime releases load IR <= 10 models from every opset this project writes.
MAX_IR_VERSION = 10


def inference_model(
    eval_model: onnx.ModelProto, params: Mapping[str, torch.Tensor], graph_output_names: Sequence[str]
) -> onnx.ModelProto:
    """The inference ModelProto for ``graph_output_names`` with ``params`` baked in."""
    model, weights = inference_model_and_weights(eval_model, params, graph_output_names)
    for index, init in enumerate(model.graph.initializer):
        if init.name in weights and is_external(init):
            model.graph.initializer[index].CopyFrom(tensor_to_proto(weights[init.name], init.name))
    return model


def inference_model_and_weights(
    eval_model: onnx.ModelProto, params: Mapping[str, torch.Tensor], graph_output_names: Sequence[str]
) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    """The inference model with its baked parameters as data-less external initializers, and their data.

    ``write_model(model, path, weights)`` writes it without ever holding the weights in one proto.
    """
    names = list(graph_output_names)
    typed = _typed_values(eval_model)
    for name in names:
        if name not in typed:
            exportable = exportable_output_names(eval_model, params)
            raise ModelError(
                f"Expected graph output for inference graph {name} could not be found. Please regenerate the eval graph. "
                f"(outputs you can export: {', '.join(exportable)}; or any other value of the eval graph)"
            )
    graph = prune_graph(eval_model.graph, names)
    del graph.output[:]
    graph.output.extend(typed[name] for name in names)
    baked = [value.name for value in graph.input if value.name in params]
    kept_inputs = [value for value in graph.input if value.name not in params]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    graph.initializer.extend(placeholder(params[name], name) for name in baked)
    _constants_to_initializers(graph)
    model = onnx.helper.make_model(graph, opset_imports=list(eval_model.opset_import))
    model.producer_name = "ort-torch-train"
    model.ir_version = max(min(eval_model.ir_version, MAX_IR_VERSION), _min_ir_version(model))
    model.metadata_props.extend(eval_model.metadata_props)
    return model, {name: params[name] for name in baked}


def save_model(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool = False) -> None:
    """Save atomically; with external data (``<name>.data`` beside it) when asked or past protobuf's 2 GB."""
    write_model(model, path, external_data=external_data)


def _constants_to_initializers(graph: onnx.GraphProto) -> None:
    """Turn Constant nodes into initializers, as ORT's in-memory graph (and so its export) holds them."""
    kept = []
    for node in graph.node:
        value = _constant_value(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if value is None:
            kept.append(node)
        else:
            value.name = node.output[0]
            graph.initializer.append(value)
    del graph.node[:]
    graph.node.extend(kept)


def _constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a Constant node holds (None for the forms an initializer cannot take)."""
    [attribute] = node.attribute
    value = onnx.helper.get_attribute_value(attribute)
    if attribute.name == "value":
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        return tensor
    arrays: dict[str, Callable[[Any], np.ndarray]] = {
        "value_float": lambda v: np.array(v, dtype=np.float32),
        "value_floats": lambda v: np.array(v, dtype=np.float32),
        "value_int": lambda v: np.array(v, dtype=np.int64),
        "value_ints": lambda v: np.array(v, dtype=np.int64),
    }
    make = arrays.get(attribute.name)
    return onnx.numpy_helper.from_array(make(value)) if make else None


def _typed_values(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every value of the graph with its type, from the graph and from shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:
        inferred = model.graph
    typed: dict[str, onnx.ValueInfoProto] = {}
    for source in (inferred, model.graph):
        for value in (*source.value_info, *source.input, *source.output):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                typed[value.name] = value
    for init in model.graph.initializer:
        typed.setdefault(init.name, onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    for node in model.graph.node:
        for name in node.output:
            if name and name not in typed:
                typed[name] = onnx.ValueInfoProto(name=name)  # produced but untyped: still exportable
    return typed


def _min_ir_version(model: onnx.ModelProto) -> int:
    try:
        return onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    except Exception:
        return 7
