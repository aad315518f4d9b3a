"""Megatron's attention blocks in a training graph, and the converted graph rewritten to split their heads.

A block is two or more column-parallel linear layers (the query, key and value projections, each its
own ``MatMul``/``Gemm`` over a parameter weight, as ORT's Megatron pass, ``megatron_transformer.cc``,
matched them in BART's attention), the attention between them, and the one row-parallel linear layer
(the output projection) that the attention's result reaches: the values computed from the projections
reach no other linear layer and no graph output, the attention holds a ``Softmax`` and only the
element-wise, reshaping and batched-product operators of ``HEAD_LOCAL_OPS`` (each head computed on its
own). A packed projection (one layer computing q, k and v, cut by ``Split``/``Slice``) is not a block.

``find_attention_blocks`` finds them in the ONNX graph, with their heads count where the graph's
shapes give it; ``shard_attention`` rewrites the converted ``fx.GraphModule`` (its sharded parameters
the state's DTensors): each projection's weight and bias ``Shard(0)`` (rank r computes heads ``r * heads / N`` to ``(r + 1) * heads / N - 1``), the
attention running on the ranks' local tensors with each reshape's heads count divided by N, and the
output projection's weight ``Shard(1)``, its ``Partial`` sums reduced to a replicated tensor before its
bias is added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from ort_torch_train.distributed.tensor_parallel_patterns import (
    LinearLayer,
    add_pair_modules,
    column_parameters,
    converted_linear,
    graph_links,
    linear_layers,
    row_parallel,
)
from ort_torch_train.errors import ModelError

HEAD_LOCAL_OPS = frozenset(
    {
        "Reshape", "Transpose", "MatMul", "Softmax", "Mul", "Div", "Add", "Sub", "Where", "Dropout", "Cast",
        "Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Identity", "Sqrt", "Pow", "Neg", "Max",
        "Min", "Expand", "Equal", "Not", "And", "Or", "Less", "Greater", "ConcatTraining",
    }
)  # fmt: skip
_RESHAPES = ("reshape", "view")


@dataclass(frozen=True)
class AttentionBlock:
    """Megatron's attention: ``columns`` (the projections, sharded by output features) then ``row``."""

    columns: tuple[LinearLayer, ...]
    row: LinearLayer
    heads: int | None  # None: the graph's shapes do not tell

    @property
    def name(self) -> str:
        """The block, named by its weights."""
        return f"({', '.join(column.weight for column in self.columns)}) -> attention -> {self.row.weight}"

    @property
    def weights(self) -> list[str]:
        """The weights of the block's linear layers."""
        return [column.weight for column in self.columns] + [self.row.weight]


def find_attention_blocks(
    graph: onnx.GraphProto,
    params: Mapping[str, Sequence[int]],
    taken: set[str],
    constants: Sequence[onnx.TensorProto] = (),
) -> list[AttentionBlock]:
    """The attention blocks of a forward ``graph`` over ``params`` (name -> shape) whose linear layers'
    weights are not in ``taken`` (an MLP pair's); ``constants``: the graph's small initializers, which
    tell the heads count where shape inference can follow them."""
    layers = linear_layers(graph, params)
    by_product = {layer.product: layer for layer in layers}
    producer, consumers = graph_links(graph)
    outputs = {value.name for value in graph.output}
    columns_of: dict[str, list[LinearLayer]] = {}
    rows: dict[str, LinearLayer] = {}
    regions: dict[str, set[str]] = {}  # the values each row's projections compute before it
    softmax: set[str] = set()  # the rows some projection reaches through a Softmax
    for layer in layers:
        reached = _attention_reached(layer, consumers, by_product, outputs, params)
        if reached is not None:
            row, through_softmax, values = reached
            columns_of.setdefault(row.weight, []).append(layer)
            rows[row.weight] = row
            regions.setdefault(row.weight, set()).update(values)
            if through_softmax:
                softmax.add(row.weight)
    found = [
        (tuple(columns), rows[row])
        for row, columns in columns_of.items()
        if len(columns) >= 2
        and row in softmax
        and not {row, *(column.weight for column in columns)} & taken
        and row not in {column.weight for column in columns}
        and _closed(regions[row], consumers, producer, by_product)
    ]
    dims = _inferred_dims(graph, constants) if found else {}
    return [AttentionBlock(columns, row, _heads(columns[0], consumers, dims)) for columns, row in found]


def _attention_reached(
    column: LinearLayer,
    consumers: Mapping[str, list[onnx.NodeProto]],
    by_product: Mapping[str, LinearLayer],
    outputs: set[str],
    params: Mapping[str, Sequence[int]],
) -> tuple[LinearLayer, bool, set[str]] | None:
    """The one linear layer the values computed from ``column``'s output reach through head-local
    operators reading no parameter, whether through a Softmax, and those values; or None."""
    reached: dict[str, LinearLayer] = {}
    seen = {column.output}
    stack, softmax = [column.output], False
    while stack:
        value = stack.pop()
        if value in outputs:
            return None
        for node in consumers.get(value, []):
            layer = next((by_product[out] for out in node.output if out in by_product), None)
            if layer is not None and layer.input == value:
                reached[layer.weight] = layer
                continue
            if node.op_type not in HEAD_LOCAL_OPS or len(reached) > 1 or any(name in params for name in node.input):
                return None
            softmax = softmax or node.op_type == "Softmax"
            for out in node.output:
                if out and out not in seen:
                    seen.add(out)
                    stack.append(out)
    return (next(iter(reached.values())), softmax, seen) if len(reached) == 1 else None


def _closed(
    region: set[str],
    consumers: Mapping[str, list[onnx.NodeProto]],
    producer: Mapping[str, onnx.NodeProto],
    by_product: Mapping[str, LinearLayer],
) -> bool:
    """Whether the values entering the attention ``region`` from outside come from no linear layer (a
    projection that is not the block's, such as a key projection left whole), looking through shapes."""
    entering = {
        name
        for value in region
        for node in consumers.get(value, [])
        for name in node.input
        if name and name not in region
    }
    seen: set[str] = set()
    stack = list(entering)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in by_product:
            return False
        node = producer.get(name)
        if node is not None and node.op_type != "Shape":
            stack.extend(node.input)
    return True


def _inferred_dims(graph: onnx.GraphProto, constants: Sequence[onnx.TensorProto]) -> dict[str, list[int | None]]:
    """The dimensions ONNX shape inference (with data propagation) gives ``graph``'s values (None: unknown);
    empty when it cannot read the graph."""
    model = onnx.helper.make_model(graph)
    model.graph.initializer.extend(constants)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # shape inference is a hint here: a graph it cannot read leaves the count to run time
        return {}
    return {
        value.name: [dim.dim_value if dim.HasField("dim_value") else None for dim in value.type.tensor_type.shape.dim]
        for value in inferred.graph.value_info
    }


def _heads(
    column: LinearLayer, consumers: Mapping[str, list[onnx.NodeProto]], dims: Mapping[str, list[int | None]]
) -> int | None:
    """The heads count of the reshape splitting ``column``'s output into ``[..., heads, head_dim]``, where
    the inferred ``dims`` give it."""
    reshape = next((node for node in consumers.get(column.output, []) if node.op_type == "Reshape"), None)
    shape = dims.get(reshape.output[0], []) if reshape is not None else []
    if len(shape) < 2:
        return None
    if shape[-2]:
        return shape[-2]
    return column.out_features // shape[-1] if shape[-1] else None


class LocalHeads(nn.Module):
    """A projection's output (a ``Shard(-1)`` DTensor) as this rank's local tensor, its heads only."""

    def forward(self, value: DTensor) -> Tensor:
        return value.to_local()


class ReshapeLocalHeads(nn.Module):
    """A reshape inside an attention block, on this rank's heads. A target shape written for all the
    heads has its heads dimension divided by N: splitting the features (a rank more), the dimension
    before the last when it is the block's ``heads`` count or times the last gives one of its
    projections' ``features``; otherwise the last when it is one of ``features``. Any other target
    (a -1 there, a shape computed from the local tensor) is taken as it is."""

    def __init__(self, size: int, features: Sequence[int], heads: int | None) -> None:
        super().__init__()
        self.size, self.features, self.heads = size, frozenset(features), heads

    def forward(self, value: Tensor, shape: Sequence[int]) -> Tensor:
        target = [int(dim) for dim in shape]
        heads_dim = None
        if len(target) > value.dim() and len(target) >= 2:
            if target[-2] > 0 and (target[-2] == self.heads or target[-2] * target[-1] in self.features):
                heads_dim = len(target) - 2
        elif target and target[-1] in self.features:
            heads_dim = len(target) - 1
        if heads_dim is not None:
            if target[heads_dim] % self.size:
                raise ModelError(
                    f"tensor_parallel_size={self.size}: the attention reshapes {list(value.shape)} (this rank's "
                    f"heads) into {target}, written for all heads; expected a heads dimension that is a multiple "
                    f"of {self.size}"
                )
            target[heads_dim] //= self.size
        return value.reshape(target)


class EnterRow(nn.Module):
    """The attention's result (this rank's heads, a local tensor) as a ``Shard(-1)`` DTensor of the mesh."""

    def __init__(self, mesh: DeviceMesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, value: Tensor) -> DTensor:
        return DTensor.from_local(value, self.mesh, [Shard(value.dim() - 1)], run_check=False)


def sharded_block_parameters(blocks: Sequence[AttentionBlock]) -> dict[str, int]:
    """The parameters of ``blocks`` held sharded, with the dimension each is cut along: the projections'
    weights and biases by output features (0), the output projections' weights by input features (1)."""
    dims: dict[str, int] = {}
    for block in blocks:
        for column in block.columns:
            dims.update(column_parameters(column))
        dims[block.row.weight] = 1
    return dims


def shard_attention(
    module: fx.GraphModule, blocks: Sequence[AttentionBlock], by_name: Mapping[str, fx.Node], mesh: DeviceMesh
) -> set[fx.Node]:
    """Rewrite ``module`` (whose parameters' placeholders are ``by_name``) so that each of ``blocks`` runs
    its heads split across ``mesh`` (see the module doc); the linear nodes that read the sharded
    parameters. Raises naming a block the converted graph lost."""
    graph = module.graph
    rewritten: set[fx.Node] = set()
    add_pair_modules(module, mesh)
    module.add_submodule("tensor_parallel_local_heads", LocalHeads())
    module.add_submodule("tensor_parallel_enter_row", EnterRow(mesh))
    for number, block in enumerate(blocks):
        reshape = f"tensor_parallel_reshape_heads_{number}"
        features = [column.out_features for column in block.columns]
        module.add_submodule(reshape, ReshapeLocalHeads(mesh.size(), features, block.heads))
        row = converted_linear(block.row, by_name, f"the attention block {block.name}")
        columns = [converted_linear(column, by_name, f"the attention block {block.name}") for column in block.columns]
        entered: dict[fx.Node, fx.Node] = {}  # one replicated input per distinct input: one gradient all-reduce
        locals_ = []
        for layer, column in zip(block.columns, columns):
            source = column.args[0]
            assert isinstance(source, fx.Node)
            with graph.inserting_before(column):
                if source not in entered:
                    entered[source] = graph.call_module("tensor_parallel_enter", (source,))
            bias = None if layer.bias is None else by_name[layer.bias]
            column.target, column.args = F.linear, (entered[source], by_name[layer.weight], bias)
            rewritten.add(column)
            with graph.inserting_after(column):
                local = graph.call_module("tensor_parallel_local_heads", (column,))
            for user in [user for user in column.users if user is not local]:
                user.replace_input_with(column, local)
            locals_.append(local)
        _reshape_heads(graph, locals_, row, block, reshape)
        with graph.inserting_before(row):
            sharded = graph.call_module("tensor_parallel_enter_row", (row.args[0],))
        row_parallel(graph, row, sharded, block.row, by_name)
        rewritten.add(row)
    return rewritten


def _reshape_heads(
    graph: fx.Graph, starts: Sequence[fx.Node], row: fx.Node, block: AttentionBlock, reshape: str
) -> None:
    """Point the reshapes between the projections' local outputs ``starts`` and the output projection
    ``row`` at the ``reshape`` submodule (a ``ReshapeLocalHeads``); raises when the values escape past
    ``row``."""
    seen: set[fx.Node] = set()
    stack = list(starts)
    reached_row = False
    while stack:
        node = stack.pop()
        for user in node.users:
            if user is row:
                reached_row = True
            elif user.op == "output":
                raise ModelError(f"tensor parallel: the attention block {block.name} is a graph output when converted")
            elif user not in seen:
                seen.add(user)
                stack.append(user)
    if not reached_row:
        raise ModelError(f"tensor parallel: the attention block {block.name} does not reach its output projection")
    for node in seen:
        if node.op == "call_method" and node.target in _RESHAPES:
            shape = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) else node.args[1:]
            node.op, node.target, node.args = (
                "call_module",
                reshape,
                (node.args[0], tuple(shape)),
            )
        elif node.op == "call_function" and node.target is torch.reshape:
            node.op, node.target = "call_module", reshape
