"""Graph edits ORT's generator makes (parameters to inputs, eval-mode Dropout/BatchNorm, outputs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import onnx

from ort_torch_train.errors import ModelError

# ORT 1.19.2 loads models up to IR version 10, whose newest default-domain opset is 21.
ORT_MAX_IR_VERSION = 10
ORT_MAX_OPSET = 21


def find_value_info(values: Iterable[onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto | None:
    """The value named ``name`` among ``values``, or None."""
    return next((value for value in values if value.name == name), None)


def node_arg_exists(model: onnx.ModelProto, name: str) -> bool:
    """Whether some node reads or writes ``name`` (onnxblock's test before adding a target input)."""
    return any(name in node.input or name in node.output for node in model.graph.node)


def value_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name of the graph: inputs, initializers, node outputs."""
    names = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    names.update(output for node in graph.node for output in node.output if output)
    return names


def register_graph_outputs(model: onnx.ModelProto, output_names: Sequence[str]) -> None:
    """Make ``output_names`` the graph outputs, typed from existing outputs or (inferred) value_info."""
    value_infos = {value.name: value for value in model.graph.value_info}
    outputs = {value.name: value for value in model.graph.output}
    registered = []
    for name in output_names:
        value = outputs.get(name) or value_infos.get(name)
        if value is None:
            raise ModelError(
                f"graph output {name!r} has no type: ONNX shape inference could not type it and no value_info "
                "declares it (a custom block can append one to self.base.graph.value_info)"
            )
        registered.append(value)
    del model.graph.output[:]
    model.graph.output.extend(registered)


def move_initializers_to_inputs(model: onnx.ModelProto, names: set[str]) -> None:
    """Turn the initializers in ``names`` into graph inputs, appended in initializer order."""
    kept = []
    for init in model.graph.initializer:
        if init.name in names:
            existing = find_value_info(model.graph.input, init.name)
            if existing is not None:  # IR < 4 style: the initializer was listed as an input already
                model.graph.input.remove(existing)
            model.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims))
        else:
            kept.append(init)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)


def batch_statistics_nodes(model: onnx.ModelProto) -> list[str]:
    """The BatchNormalization nodes that normalise with each batch's statistics (exported in training mode)."""
    return [
        node.name or node.output[0]
        for node in model.graph.node
        if node.op_type == "BatchNormalization" and any(a.name == "training_mode" and a.i == 1 for a in node.attribute)
    ]


def disable_training_mode(model: onnx.ModelProto) -> None:
    """Eval semantics as ORT writes them: Dropout's training_mode input blanked, BatchNorm training_mode=0."""
    for node in model.graph.node:
        if node.op_type == "Dropout" and len(node.input) > 2:
            node.input[2] = ""
        elif node.op_type == "BatchNormalization":
            for attribute in node.attribute:
                if attribute.name == "training_mode":
                    attribute.i = 0


def trim_inference_batchnorm_outputs(model: onnx.ModelProto) -> list[str]:
    """Drop the unused running-stat outputs of eval-mode BatchNormalization nodes (ORT refuses them).

    Returns the names of the trimmed nodes.
    """
    graph = model.graph
    consumed = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    trimmed, dropped = [], set()
    for node in graph.node:
        if node.op_type != "BatchNormalization" or len(node.output) == 1:
            continue
        if any(a.name == "training_mode" and a.i == 1 for a in node.attribute):
            continue
        extra = list(node.output[1:])
        if consumed.intersection(extra):
            continue
        del node.output[1:]
        dropped.update(extra)
        trimmed.append(node.name or node.output[0])
    kept = [value for value in graph.value_info if value.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return trimmed


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain opset, or None when it imports none."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    return None


def ort_ir_version(model: onnx.ModelProto) -> int:
    """The IR version to write: at most 10 (ORT 1.19.2's limit) unless the opsets need a newer one."""
    try:
        needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    except Exception:  # an opset newer than this onnx knows: keep what the model says
        needed = model.ir_version
    return max(min(model.ir_version, ORT_MAX_IR_VERSION), needed)


def ort_loadable(model: onnx.ModelProto) -> bool:
    """Whether ORT 1.19.2 accepts the model's IR version and default-domain opset."""
    opset = default_opset(model)
    return model.ir_version <= ORT_MAX_IR_VERSION and (opset is None or opset <= ORT_MAX_OPSET)


def declare_constant_shapes(graph: onnx.GraphProto) -> None:
    """Give each value a Constant node computes the shape of the tensor it holds where ``value_info``
    declares another (onnxruntime-genai's builder declares its ``[1]`` constants as scalars)."""
    held = {
        node.output[0]: list(node.attribute[0].t.dims)
        for node in graph.node
        if node.op_type == "Constant"
        and node.domain in ("", "ai.onnx")
        and len(node.attribute) == 1
        and node.attribute[0].name == "value"
    }
    for value in graph.value_info:
        dims = held.get(value.name)
        tensor_type = value.type.tensor_type
        if dims is None or not tensor_type.HasField("shape"):
            continue
        declared = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim]
        if declared != dims:
            tensor_type.shape.CopyFrom(
                onnx.TensorShapeProto(dim=[onnx.TensorShapeProto.Dimension(dim_value=d) for d in dims])
            )
