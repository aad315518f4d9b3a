"""Megatron's weight pairs in a training graph, and the converted graph rewritten to run them sharded.

A pair is a column-parallel linear layer, an element-wise activation, then a row-parallel linear
layer: ``MatMul``/``Gemm`` with a parameter weight (directly or through a ``Transpose``), an optional
``Add`` of a parameter bias, one of ``ACTIVATIONS``, and a second such layer reading the activation
(the MLP block ORT's Megatron pass, ``megatron_transformer.cc``, splits). ``find_weight_pairs`` finds
them in the ONNX graph; ``shard_pairs`` rewrites the converted ``fx.GraphModule``, whose fused
``linear(x, weight, bias)`` nodes they became, so that each pair runs on DTensors of a device mesh:
the column layer's weight and bias ``Shard(0)``, the row layer's weight ``Shard(1)``, the pair's
input ``Replicate``, and its output the ``Partial`` sums reduced to a replicated tensor before the
row layer's bias is added. The sharded parameters arrive as the state's own DTensor shards
(``tensor_parallel_ranks.py``), so their gradients stay sharded; any other reader of such a parameter
(a weight tied elsewhere) takes it gathered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from ort_torch_train.errors import ModelError
from ort_torch_train.passes.onednn_linear import LINEARS

ACTIVATIONS = ("Relu", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Tanh", "Sigmoid")
_FX_ACTIVATIONS = {torch.relu, F.relu, F.gelu, torch.tanh, torch.sigmoid, F.silu, F.tanh, F.sigmoid}
_FX_ACTIVATION_METHODS = {"relu", "tanh", "sigmoid"}


@dataclass(frozen=True)
class LinearLayer:
    """A MatMul/Gemm of the ONNX graph whose weight is a parameter."""

    weight: str
    bias: str | None
    output: str  # the value after the bias, if any
    input: str
    out_features: int
    product: str = ""  # the MatMul/Gemm's own output (before the bias)


@dataclass(frozen=True)
class WeightPair:
    """Megatron's MLP pair: ``column`` (sharded by output features), the activation, then ``row``."""

    column: LinearLayer
    activation: str
    row: LinearLayer

    @property
    def name(self) -> str:
        """The pair, named by its weights."""
        return f"{self.column.weight} -> {self.activation} -> {self.row.weight}"


def find_weight_pairs(
    graph: onnx.GraphProto, params: Mapping[str, Sequence[int]]
) -> tuple[list[WeightPair], list[str]]:
    """The weight pairs of a forward ``graph`` over ``params`` (name -> shape), and the weights of the
    linear layers that are in none (they run replicated)."""
    layers = linear_layers(graph, params)
    _, consumers = graph_links(graph)
    by_input: dict[str, list[LinearLayer]] = defaultdict(list)
    for layer in layers:
        by_input[layer.input].append(layer)
    pairs: list[WeightPair] = []
    paired: set[str] = set()
    for column in layers:
        if column.weight in paired:
            continue
        for activation in consumers.get(column.output, []):
            rows = [row for row in by_input.get(activation.output[0], []) if row.weight not in paired]
            if activation.op_type in ACTIVATIONS and len(rows) == 1 and rows[0].weight != column.weight:
                pairs.append(WeightPair(column, activation.op_type, rows[0]))
                paired.update((column.weight, rows[0].weight))
                break
    unmatched = [layer.weight for layer in layers if layer.weight not in paired]
    return pairs, unmatched


def graph_links(graph: onnx.GraphProto) -> tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
    """The node producing each value of ``graph``, and the nodes reading it."""
    nodes = list(graph.node)
    producer = {output: node for node in nodes for output in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in nodes:
        for name in node.input:
            consumers[name].append(node)
    return producer, consumers


def linear_layers(graph: onnx.GraphProto, params: Mapping[str, Sequence[int]]) -> list[LinearLayer]:
    """The MatMul/Gemm nodes of ``graph`` over a 2-D parameter of ``params`` (name -> shape), in order."""
    producer, consumers = graph_links(graph)
    return [layer for node in graph.node if (layer := _linear_layer(node, producer, consumers, params)) is not None]


def _linear_layer(
    node: onnx.NodeProto,
    producer: Mapping[str, onnx.NodeProto],
    consumers: Mapping[str, list[onnx.NodeProto]],
    params: Mapping[str, Sequence[int]],
) -> LinearLayer | None:
    """``node`` as a linear layer over a 2-D parameter weight, or None."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return None
    weight, transposed = node.input[1], False
    source = producer.get(weight)
    if weight not in params and source is not None and source.op_type == "Transpose" and source.input[0] in params:
        weight, transposed = source.input[0], True
    if weight not in params or len(params[weight]) != 2:
        return None
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        transposed = transposed != bool(trans_b)
    out_features = params[weight][0] if transposed else params[weight][1]
    bias, output = None, node.output[0]
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] in params:
        bias = node.input[2]
    else:
        for add in consumers.get(output, []):
            other = [name for name in add.input if name != output]
            if add.op_type == "Add" and len(other) == 1 and other[0] in params and len(params[other[0]]) == 1:
                bias, output = other[0], add.output[0]
                break
    return LinearLayer(weight, bias, output, node.input[0], int(out_features), node.output[0])


class EnterPair(nn.Module):
    """A pair's input as a replicated DTensor; in backward, the ranks' partial gradients summed."""

    def __init__(self, mesh: DeviceMesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, value: Tensor) -> DTensor:
        return DTensor.from_local(value, self.mesh, [Replicate()], run_check=False)


class LeavePair(nn.Module):
    """A pair's output: its ranks' partial sums reduced into the whole tensor, on every rank (also a sharded
    parameter gathered whole)."""

    def forward(self, value: DTensor) -> Tensor:
        return value.redistribute(value.device_mesh, [Replicate()]).to_local()


def parameter_nodes(module: fx.GraphModule, params: Sequence[str]) -> dict[str, fx.Node]:
    """The placeholders of ``module`` (the converted graph over ``params``, its last placeholders), by name."""
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    if len(placeholders) < len(params):
        raise ModelError(
            f"tensor parallel: the converted graph has {len(placeholders)} inputs for {len(params)} parameters"
        )
    return dict(zip(params, placeholders[len(placeholders) - len(params) :]))


def add_pair_modules(module: fx.GraphModule, mesh: DeviceMesh) -> None:
    """Give ``module`` the submodules a sharded linear layer calls (once)."""
    if not hasattr(module, "tensor_parallel_enter"):
        module.add_submodule("tensor_parallel_enter", EnterPair(mesh))
        module.add_submodule("tensor_parallel_leave", LeavePair())


def sharded_parameters(pairs: Sequence[WeightPair]) -> dict[str, int]:
    """The parameters of ``pairs`` held sharded, with the dimension each is cut along: the column layers'
    weights and biases by output features (0), the row layers' weights by input features (1)."""
    dims: dict[str, int] = {}
    for pair in pairs:
        dims.update(column_parameters(pair.column))
        dims[pair.row.weight] = 1
    return dims


def column_parameters(layer: LinearLayer) -> dict[str, int]:
    """A column-parallel layer's weight and bias, cut along their output features (dimension 0)."""
    return {layer.weight: 0} if layer.bias is None else {layer.weight: 0, layer.bias: 0}


def shard_pairs(
    module: fx.GraphModule, pairs: Sequence[WeightPair], by_name: Mapping[str, fx.Node], mesh: DeviceMesh
) -> set[fx.Node]:
    """Rewrite ``module`` (whose parameters' placeholders are ``by_name``, the sharded ones DTensors) so
    that each of ``pairs`` runs sharded on ``mesh`` (see the module doc); the linear nodes that read the
    sharded parameters. Raises naming a pair the converted graph lost."""
    graph = module.graph
    add_pair_modules(module, mesh)
    rewritten: set[fx.Node] = set()
    for pair in pairs:
        column, activation, row = _converted_pair(pair, by_name)
        with graph.inserting_before(column):
            entered = graph.call_module("tensor_parallel_enter", (column.args[0],))
        bias = None if pair.column.bias is None else by_name[pair.column.bias]
        column.target, column.args = F.linear, (entered, by_name[pair.column.weight], bias)  # DTensor's linear
        row_parallel(graph, row, activation, pair.row, by_name)
        rewritten.update((column, row))
    return rewritten


def row_parallel(
    graph: fx.Graph, row: fx.Node, sharded_input: fx.Node, layer: LinearLayer, by_name: Mapping[str, fx.Node]
) -> None:
    """Rewrite the linear ``row`` (``layer``) to multiply ``sharded_input`` by its row-sharded weight, leave the
    tensor-parallel region (the partial sums reduced) and add its bias after; every reader takes the result."""
    row.target, row.args = F.linear, (sharded_input, by_name[layer.weight], None)
    with graph.inserting_after(row):
        left = graph.call_module("tensor_parallel_leave", (row,))
    result = left
    if layer.bias is not None:
        with graph.inserting_after(left):
            result = graph.call_function(torch.add, (left, by_name[layer.bias]))
    for user in [user for user in row.users if user is not left]:
        user.replace_input_with(row, result)


def converted_linear(layer: LinearLayer, by_name: Mapping[str, fx.Node], what: str) -> fx.Node:
    """The converted graph's ``linear`` node of ``layer`` (of ``what``, named when it is missing)."""
    for node in by_name[layer.weight].users:
        if _is_linear(node, by_name[layer.weight], by_name.get(layer.bias or "")):
            return node
    raise ModelError(
        f"tensor parallel: the linear layer over {layer.weight} of {what} is not one linear node in the converted "
        "graph, so it cannot be sharded"
    )


def _converted_pair(pair: WeightPair, by_name: Mapping[str, fx.Node]) -> tuple[fx.Node, fx.Node, fx.Node]:
    """The converted graph's ``linear`` nodes and activation of ``pair``."""
    for column in by_name[pair.column.weight].users:
        if not _is_linear(column, by_name[pair.column.weight], by_name.get(pair.column.bias or "")):
            continue
        activations = list(column.users)
        if len(activations) != 1 or not _is_activation(activations[0]):
            continue
        rows = list(activations[0].users)
        if len(rows) == 1 and _is_linear(rows[0], by_name[pair.row.weight], by_name.get(pair.row.bias or "")):
            if rows[0].args[0] is activations[0]:
                return column, activations[0], rows[0]
    raise ModelError(
        f"tensor parallel: the weight pair {pair.name} of the ONNX graph is not two linear layers around "
        "one activation in the converted graph, so it cannot be sharded"
    )


def _is_linear(node: fx.Node, weight: fx.Node, bias: fx.Node | None) -> bool:
    """Whether ``node`` is ``linear(x, weight, bias)`` (``F.linear`` or its oneDNN form)."""
    if node.op != "call_function" or node.target not in LINEARS or node.kwargs:
        return False
    args = list(node.args) + [None] * (3 - len(node.args))
    return args[1] is weight and args[2] is bias


def _is_activation(node: fx.Node) -> bool:
    """Whether ``node`` is an element-wise activation of one tensor."""
    if node.op == "call_function":
        return node.target in _FX_ACTIVATIONS
    return node.op == "call_method" and node.target in _FX_ACTIVATION_METHODS


def gather_other_readers(graph: fx.Graph, sharded: Sequence[fx.Node], rewritten: set[fx.Node]) -> None:
    """Give each reader of a ``sharded`` parameter's placeholder that is not one of the ``rewritten`` linear
    nodes the whole parameter, gathered (``tensor_parallel_leave``)."""
    for placeholder in sharded:
        others = [user for user in placeholder.users if user not in rewritten]
        if not others:
            continue
        with graph.inserting_after(placeholder):
            whole = graph.call_module("tensor_parallel_leave", (placeholder,))
        for user in others:
            user.replace_input_with(placeholder, whole)
