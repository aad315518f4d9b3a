"""Checks on loaded models before they are converted: the ONNX checker, and the training/eval pair.

ORT refuses a model the ONNX checker rejects (a duplicated attribute, an undefined input, ...), and
trains the training graph whatever the eval graph computes; the eval graph must read the same
parameters (names, element types, shapes) and take user inputs of the same element types.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import onnx

from ort_torch_train.errors import ModelError
from ort_torch_train.graph.layout import graph_without_initializers, prune_graph

_PROTOBUF_LIMIT = 2**31 - 1  # the checker serializes the model; larger ones are checked by path only
# ops ORT registers in the ONNX domain that ONNX has no schema for (ORT's generate_artifacts fuses
# a Llama RMSNorm into SimplifiedLayerNormalization); the checker sees them in ORT's own domain
_ORT_OPS_IN_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})
_ORT_DOMAIN = "com.microsoft"


def check_model(model: onnx.ModelProto, what: str, outputs: Iterable[str] | None = None) -> None:
    """Run the ONNX checker on model (named ``what`` in the error), or on the part of it that
    computes ``outputs`` (a training graph's gradient ops have ORT's schemas, not ONNX's)."""
    _check_outputs_produced(model, what)
    _check_initializer_sizes(model, what)
    if model.ByteSize() > _PROTOBUF_LIMIT:
        return
    # the checker reads the initializers as inputs of their type and shape (their sizes are checked above):
    # their data is not copied three times (pruned, made into a model, serialized) to be checked
    light = graph_without_initializers(model.graph)
    inputs = {value.name for value in light.input}
    light.input.extend(
        onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        for init in model.graph.initializer
        if init.name not in inputs
    )
    graph = prune_graph(light, [value.name for value in model.graph.output] if outputs is None else outputs)
    typed = [value for value in graph.output if value.HasField("type")]  # ORT infers missing types
    del graph.output[:]
    graph.output.extend(typed)
    opset_imports = with_ort_domain(graph, list(model.opset_import))
    model = onnx.helper.make_model(
        graph, opset_imports=opset_imports, ir_version=model.ir_version, functions=model.functions
    )
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as error:
        raise ModelError(f"{what} fails the ONNX checker: {error}") from None


def with_ort_domain(graph: onnx.GraphProto, opset_imports: list[onnx.OperatorSetIdProto]) -> list:
    """Move the ops ORT registers in the ONNX domain (no ONNX schema) to com.microsoft in ``graph``, in
    place, so that the checker finds their schemas; returns the opset imports with com.microsoft."""
    ort_nodes = [
        node for node in graph.node if node.domain in ("", "ai.onnx") and node.op_type in _ORT_OPS_IN_ONNX_DOMAIN
    ]
    for node in ort_nodes:
        node.domain = _ORT_DOMAIN
    if ort_nodes and all(opset.domain != _ORT_DOMAIN for opset in opset_imports):
        opset_imports = [*opset_imports, onnx.helper.make_opsetid(_ORT_DOMAIN, 1)]
    return opset_imports


def _check_outputs_produced(model: onnx.ModelProto, what: str) -> None:
    graph = model.graph
    known = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    known.update(name for node in graph.node for name in node.output)
    for value in graph.output:
        if value.name not in known:
            raise ModelError(f"{what}: graph output {value.name!r} is produced by no node, input or initializer")


def _check_initializer_sizes(model: onnx.ModelProto, what: str) -> None:
    """Inline initializers must hold as many elements as their dims say."""
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL or init.data_type in (0, onnx.TensorProto.STRING):
            continue
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{what}: initializer {init.name!r} has unknown data_type {init.data_type}") from None
        if any(dim < 0 for dim in init.dims):
            raise ModelError(f"{what}: initializer {init.name!r} has a negative dimension in dims {list(init.dims)}")
        count = math.prod(init.dims)
        if init.HasField("raw_data"):
            held, expected = len(init.raw_data), count * itemsize
            unit = "bytes"
        else:
            field = onnx.helper.tensor_dtype_to_field(init.data_type)
            held, expected, unit = len(getattr(init, field)), count, "values"
            if init.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
                expected *= 2
            if init.data_type in _PACKED_IN_INT32 and expected:
                continue  # packed types: leave to the checker
        if held != expected:
            raise ModelError(
                f"{what}: initializer {init.name!r} holds {held} {unit} but dims {list(init.dims)} need {expected}"
            )


_PACKED_IN_INT32 = {
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
    getattr(onnx.TensorProto, "FLOAT8E4M3FN", -1),
    getattr(onnx.TensorProto, "FLOAT8E5M2", -1),
    getattr(onnx.TensorProto, "FLOAT8E4M3FNUZ", -1),
    getattr(onnx.TensorProto, "FLOAT8E5M2FNUZ", -1),
}


def _input_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    return {value.name: value.type for value in model.graph.input}


def _describe(type_proto: onnx.TypeProto) -> str:
    tensor = type_proto.tensor_type
    dims = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?") for dim in tensor.shape.dim]
    return f"{onnx.TensorProto.DataType.Name(tensor.elem_type)}{dims if tensor.HasField('shape') else ''}"


def check_eval_pair(training_model: onnx.ModelProto, eval_model: onnx.ModelProto, param_names: Iterable[str]) -> None:
    """Refuse an eval model whose parameters or user inputs disagree with the training model's."""
    params = set(param_names)
    train, evaluate = _input_types(training_model), _input_types(eval_model)
    for name, eval_type in evaluate.items():
        train_type = train.get(name)
        if train_type is None:
            if name in params:
                raise ModelError(f"eval model reads parameter {name!r}, which the training model does not take")
            continue
        if name in params:
            same = train_type == eval_type
        else:  # user inputs: element types must agree (batch sizes may differ)
            same = train_type.tensor_type.elem_type == eval_type.tensor_type.elem_type
        if not same:
            role = "parameter" if name in params else "user input"
            raise ModelError(
                f"eval model does not match the training model: {role} {name!r} is declared "
                f"{_describe(eval_type)} in the eval model, {_describe(train_type)} in the training model"
            )
