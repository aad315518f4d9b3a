"""From a forward-only ONNX model with its loss as an output to the core's training model and state.

Which initializers are trained follows ORT 1.13 (``training_session.cc``, ``ConfigureForTraining``):

* ``weights_to_train`` when given, less the names without any consumer node (ORT drops those
  with a warning and, when none is left, falls back to the default below);
* otherwise every initializer found walking back from the loss (``GetTrainableModelInitializers``),
  except those read at a stop-gradient input (``STOP_GRADIENT_EDGES`` in
  ``gradient_graph_builder.h``) or matching ``immutable_weights`` (op type, input index, scalar value);
* then less ``weights_not_to_train``, and less every initializer that is not float, float16 or bfloat16.

Trained weights and the ``weights_not_to_train`` initializers become graph inputs and parameters of
the TrainingState (the latter frozen); every other initializer stays a constant of the graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import onnx
import torch
from onnx import TensorProto, helper

from ort_torch_train.dtypes import tensor_from_proto
from ort_torch_train.errors import ModelError

# gradient_graph_builder.h (ORT 1.13): inputs through which no gradient flows
STOP_GRADIENT_EDGES: dict[str, frozenset[int]] = {
    op: frozenset(indices)
    for op, indices in {
        "Not": {0},
        "And": {0, 1},
        "BatchNormalization": {3, 4},
        "BatchNormInternal": {3, 4},
        "Or": {0, 1},
        "Xor": {0, 1},
        "Equal": {0, 1},
        "Less": {0, 1},
        "LessOrEqual": {0, 1},
        "Greater": {0, 1},
        "GreaterOrEqual": {0, 1},
        "IsInf": {0},
        "IsNaN": {0},
        "NonZero": {0},
        "Pow": {1},
        "Gather": {1},
        "GatherElements": {1},
        "GatherND": {1},
        "Shape": {0},
        "Size": {0},
        "Reshape": {1},
        "Expand": {1},
        "Dropout": {1, 2},
        "Slice": {1, 2, 3, 4},
        "SparseSoftmaxCrossEntropy": {1, 2},
        "SoftmaxCrossEntropyLoss": {1, 2},
        "SoftmaxCrossEntropyLossInternal": {1, 2, 3},
        "ConstantOfShape": {0},
        "Scatter": {1},
        "ScatterElements": {1},
        "ScatterND": {1},
        "OneHot": {0, 1, 2},
        "Where": {0},
        "Range": {0, 1, 2},
        "Tile": {1},
        "BroadcastGradientArgs": {0, 1},
        "TopK": {1},
        "Squeeze": {1},
        "Unsqueeze": {1},
        "ReduceSum": {1},
        "Split": {1},
        "Clip": {1, 2},
    }.items()
}
TRAINABLE_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


@dataclass(frozen=True)
class TrainingSetup:
    """The core's inputs: training graph (``[user inputs..., params...]`` -> ``[loss, outputs...]``)
    and its parameters (trained ones require grad), in the model's initializer order."""

    model: onnx.ModelProto
    params: dict[str, torch.nn.Parameter]
    trained: tuple[str, ...]


def build_training_setup(
    forward: onnx.ModelProto,
    loss_name: str,
    weights_to_train: Iterable[str],
    weights_not_to_train: Iterable[str],
    immutable_weights: Mapping[str, Iterable[tuple[int, float]]],
) -> TrainingSetup:
    """The training graph and parameters for ``forward`` trained on its output ``loss_name``."""
    graph = forward.graph
    initializers = {init.name: init for init in graph.initializer}
    _check_loss(graph, loss_name)
    not_trained = set(weights_not_to_train)
    trained = (
        _weights_to_train(graph, initializers, loss_name, set(weights_to_train), _immutable_table(immutable_weights))
        - not_trained
    )
    trained = {name for name in trained if initializers[name].data_type in TRAINABLE_TYPES}
    frozen = not_trained & set(initializers)
    order = [name for name in initializers if name in trained or name in frozen]
    params = {
        name: torch.nn.Parameter(tensor_from_proto(initializers[name]), requires_grad=name in trained) for name in order
    }
    model = _with_parameter_inputs(forward, order, loss_name)
    return TrainingSetup(model, params, tuple(name for name in order if name in trained))


def _check_loss(graph: onnx.GraphProto, loss_name: str) -> None:
    outputs = [value.name for value in graph.output]
    if loss_name not in outputs:
        raise ModelError(
            f"TrainingParameters.loss_output_name {loss_name!r} is not an output of the model; "
            f"its outputs are {outputs}"
        )


def _immutable_table(
    immutable_weights: Mapping[str, Iterable[tuple[int, float]]],
) -> dict[str, list[tuple[int, float]]]:
    table: dict[str, list[tuple[int, float]]] = {}
    for op_type, entries in immutable_weights.items():
        table[op_type] = []
        for entry in entries:
            if len(entry) != 2:
                raise ValueError(
                    f"TrainingParameters.immutable_weights[{op_type!r}]: expected (input index, "
                    f"value) pairs, got {entry!r}"
                )
            table[op_type].append((int(entry[0]), float(torch.tensor(entry[1], dtype=torch.float32))))
    return table


def _weights_to_train(
    graph: onnx.GraphProto,
    initializers: dict[str, TensorProto],
    loss_name: str,
    requested: set[str],
    immutable: dict[str, list[tuple[int, float]]],
) -> set[str]:
    consumed = {name for node in graph.node for name in node.input}
    unused = sorted(requested - consumed)
    if unused:
        warnings.warn(
            f"weights_to_train: no node reads {unused}; they are excluded from training (as in ORT)", stacklevel=4
        )
    requested -= set(unused)
    missing = sorted(requested - set(initializers))
    if missing:
        raise ModelError(
            f"weights_to_train: {missing} are not initializers of the model "
            f"(its initializers are {sorted(initializers)})"
        )
    return requested or _reachable_initializers(graph, initializers, loss_name, immutable)


def _reachable_initializers(
    graph: onnx.GraphProto,
    initializers: dict[str, TensorProto],
    loss_name: str,
    immutable: dict[str, list[tuple[int, float]]],
) -> set[str]:
    """ORT's reverse walk from the loss, stopping at stop-gradient inputs."""
    producers = {output: node for node in graph.node for output in node.output if output}
    found: set[str] = set()
    seen: set[int] = set()
    stack = [producers[loss_name]] if loss_name in producers else []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stopped = STOP_GRADIENT_EDGES.get(node.op_type, frozenset())
        for index, name in enumerate(node.input):
            if not name or index in stopped:
                continue
            if name in initializers:
                if not _is_immutable(node, index, initializers[name], immutable):
                    found.add(name)
            elif name in producers:
                stack.append(producers[name])
    return found


def _is_immutable(
    node: onnx.NodeProto, index: int, tensor: TensorProto, immutable: dict[str, list[tuple[int, float]]]
) -> bool:
    if tensor.data_type != TensorProto.FLOAT or len(tensor.dims) != 0:
        return False
    value = float(onnx.numpy_helper.to_array(tensor))
    return any(index == at and value == wanted for at, wanted in immutable.get(node.op_type, ()))


def _with_parameter_inputs(forward: onnx.ModelProto, params: list[str], loss_name: str) -> onnx.ModelProto:
    """A copy of ``forward`` whose ``params`` are graph inputs (after the user inputs) and whose
    first output is the loss."""
    model = onnx.ModelProto()
    model.CopyFrom(forward)
    graph = model.graph
    by_name = {init.name: init for init in graph.initializer}
    param_set = set(params)
    user_inputs = _copies(value for value in graph.input if value.name not in by_name)
    kept = _copies(init for init in graph.initializer if init.name not in param_set)
    del graph.input[:]
    graph.input.extend(user_inputs)
    graph.input.extend(
        helper.make_tensor_value_info(name, by_name[name].data_type, list(by_name[name].dims)) for name in params
    )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    outputs = sorted(_copies(graph.output), key=lambda value: value.name != loss_name)
    del graph.output[:]
    graph.output.extend(outputs)
    return model


def _copies(messages: Iterable) -> list:
    """Detached copies of protobuf messages (safe to keep after clearing their container)."""
    copies = []
    for message in messages:
        copy = type(message)()
        copy.CopyFrom(message)
        copies.append(copy)
    return copies
