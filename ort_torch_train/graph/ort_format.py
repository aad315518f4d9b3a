"""Read an ORT-format model (``.ort``: FlatBuffers as ONNX Runtime's ``ort.fbs`` schema defines them, file
identifier ``ORTM``) into the ``onnx.ModelProto`` every other part of the pipeline reads.

The buffer is untrusted: it is walked through ``fbs_reader`` (every offset, length and alignment checked
before it is read), and a failure raises ``OrtFormatModelError`` naming the model and starting with ORT's
text "ORT model verification failed.". What the format holds comes back: opsets, the graph's nodes (in
an order where every value is made before it is read: ORT saves them by node index, which its optimizers
leave out of order), inputs, outputs, initializers (raw and string data), sparse initializers, the type
and shape of every value, subgraphs, doc strings and metadata. What is ORT's own is dropped: kernel type
resolution, edges (the names already say them) and runtime optimization records (optional to apply).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import onnx

from ort_torch_train.elem_types import ELEM_DTYPES, elem_type_name
from ort_torch_train.errors import OrtFormatModelError

from .fbs_reader import FlatBuffer, Table, Verification

ORT_FORMAT_IDENTIFIER = b"ORTM"  # the FlatBuffers file identifier of ort.fbs (bytes 4-8 of the file)
ORT_MODEL_VERIFICATION_FAILED = "ORT model verification failed."

# bytes per element of raw tensor data, by ONNX element type (ort.fbs's TensorDataType numbers them alike)
_RAW_ITEMSIZE = {code: dtype.itemsize for code, dtype in ELEM_DTYPES.items()} | {
    14: 8,  # COMPLEX64
    15: 16,  # COMPLEX128
    17: 1,  # FLOAT8E4M3FN
    18: 1,  # FLOAT8E4M3FNUZ
    19: 1,  # FLOAT8E5M2
    20: 1,  # FLOAT8E5M2FNUZ
}
_STRING = onnx.TensorProto.STRING
_TYPE_INFO_TENSOR, _TYPE_INFO_SEQUENCE, _TYPE_INFO_MAP = 1, 2, 3  # ort.fbs TypeInfoValue
_DIM_VALUE, _DIM_PARAM = 1, 2  # ort.fbs DimensionValueType
_NODE_FUSED = 1  # ort.fbs NodeType

Fail = Callable[[str], OrtFormatModelError]


def is_ort_format(head: bytes | bytearray | memoryview) -> bool:
    """Whether ``head``, a model's first bytes (8 or more), carries the ORT-format file identifier."""
    return len(head) >= 8 and bytes(head[4:8]) == ORT_FORMAT_IDENTIFIER


def read_ort_model(data: bytes | bytearray | memoryview, what: str) -> onnx.ModelProto:
    """The model an ORT-format buffer holds; ``what`` (the model's role and file) names it in errors."""
    fail: Fail = partial(_error, what)
    buf = FlatBuffer(data, Verification(ORT_MODEL_VERIFICATION_FAILED, fail, "an ORT-format model"))
    try:
        session = buf.root(ORT_FORMAT_IDENTIFIER)
        if session.string(0, "ort_version") is None:
            raise fail(f"{ORT_MODEL_VERIFICATION_FAILED} root: the ORT format version (ort_version) is missing")
        model = session.table(1, "model")
        if model is None:
            raise fail(f"{ORT_MODEL_VERIFICATION_FAILED} root: the model is missing (an ORT-format model holds one)")
        return _Reader(fail).model(model)
    finally:
        buf.release()


def read_ort_model_file(path: str, what: str) -> onnx.ModelProto:
    """``read_ort_model`` of the file at ``path``; errors name ``what`` and the path."""
    with open(path, "rb") as file:
        data = file.read()
    return read_ort_model(data, f"{what} {path!r}")


def _error(what: str, message: str) -> OrtFormatModelError:
    return OrtFormatModelError(f"{what} is a damaged or unreadable ORT-format model (.ort): {message}")


class _Reader:
    """Turns the verified tables of one buffer into protobuf messages."""

    def __init__(self, fail: Fail) -> None:
        self.fail = fail

    def invalid(self, where: str, problem: str) -> OrtFormatModelError:
        """An error for a well-formed buffer whose content cannot be a model."""
        return self.fail(f"{where}: {problem}")

    def model(self, table: Table) -> onnx.ModelProto:
        """ort.fbs ``Model``."""
        model = onnx.ModelProto(
            ir_version=int(table.scalar(0, "<q", 0, "ir_version")),
            producer_name=table.string(2, "producer_name"),
            producer_version=table.string(3, "producer_version"),
            domain=table.string(4, "domain"),
            model_version=int(table.scalar(5, "<q", 0, "model_version")),
            doc_string=table.string(6, "doc_string"),
        )
        for opset in table.tables(1, "opset_import") or []:
            version = int(opset.scalar(1, "<q", 0, "version"))
            model.opset_import.add(domain=opset.string(0, "domain") or "", version=version)
        graph = table.table(7, "graph")
        if graph is None:
            raise self.invalid(table.where, "the model has no graph")
        model.graph.CopyFrom(self.graph(graph))
        if graph_doc_string := table.string(8, "graph_doc_string"):
            model.graph.doc_string = graph_doc_string
        for entry in table.tables(9, "metadata_props") or []:
            model.metadata_props.add(key=entry.string(0, "key"), value=entry.string(1, "value"))
        return model

    def graph(self, table: Table) -> onnx.GraphProto:
        """ort.fbs ``Graph``: its values' types come from its node args, its nodes in an executable order."""
        value_infos = {info.name: info for info in map(self.value_info, table.tables(1, "node_args") or [])}
        graph = onnx.GraphProto(name="ort_format_graph")
        graph.initializer.extend(self.tensor(tensor) for tensor in table.tables(0, "initializers") or [])
        nodes = [self.node(node) for node in table.tables(2, "nodes") or []]
        inputs, outputs = table.strings(5, "inputs") or [], table.strings(6, "outputs") or []
        for name in inputs:
            graph.input.append(value_infos.get(name) or onnx.ValueInfoProto(name=name))
        for name in outputs:
            graph.output.append(value_infos.get(name) or onnx.ValueInfoProto(name=name))
        for sparse in table.tables(7, "sparse_initializers") or []:
            graph.sparse_initializer.append(self.sparse_tensor(sparse))
        graph.node.extend(self.executable_order(nodes, table.where))
        declared = {*inputs, *outputs, *(tensor.name for tensor in graph.initializer)}
        graph.value_info.extend(info for name, info in value_infos.items() if name not in declared)
        return graph

    def executable_order(self, nodes: list[tuple[onnx.NodeProto, list[str]]], where: str) -> list[onnx.NodeProto]:
        """The nodes, each after the nodes making the values it reads (stable: the file's order otherwise)."""
        producer = {output: index for index, (node, _) in enumerate(nodes) for output in node.output if output}
        needs = [
            sorted({producer[name] for name in (*node.input, *implicit) if name in producer} - {index})
            for index, (node, implicit) in enumerate(nodes)
        ]
        order: list[int] = []
        state = [0] * len(nodes)  # 0 unvisited, 1 on the path, 2 placed
        for start in range(len(nodes)):
            stack = [(start, iter(needs[start]))]
            if state[start]:
                continue
            state[start] = 1
            while stack:
                index, pending = stack[-1]
                before = next(pending, None)
                if before is None:
                    stack.pop()
                    state[index] = 2
                    order.append(index)
                elif state[before] == 1:
                    raise self.invalid(
                        where, f"the nodes form a cycle through {nodes[before][0].op_type} node {before}"
                    )
                elif state[before] == 0:
                    state[before] = 1
                    stack.append((before, iter(needs[before])))
        return [nodes[index][0] for index in order]

    def node(self, table: Table) -> tuple[onnx.NodeProto, list[str]]:
        """ort.fbs ``Node`` and the outer-scope names its subgraphs read (its implicit inputs)."""
        op_type = table.string(5, "op_type")
        if not op_type:
            raise self.invalid(table.where, "the node has no op_type")
        if int(table.scalar(6, "<i", 0, "type")) == _NODE_FUSED:
            raise self.invalid(
                table.where,
                f"{op_type} is a node fused by an execution provider at conversion time (NodeType Fused); "
                "only models whose nodes are operators can be read",
            )
        node = onnx.NodeProto(
            name=table.string(0, "name"),
            doc_string=table.string(1, "doc_string"),
            domain=table.string(2, "domain"),
            op_type=op_type,
        )
        node.input.extend(table.strings(8, "inputs") or [])
        node.output.extend(table.strings(9, "outputs") or [])
        node.attribute.extend(self.attribute(attribute) for attribute in table.tables(10, "attributes") or [])
        return node, table.strings(12, "implicit_inputs") or []

    def attribute(self, table: Table) -> onnx.AttributeProto:
        """ort.fbs ``Attribute`` (its AttributeType numbers the kinds as ONNX's AttributeProto does)."""
        name = table.string(0, "name")
        if not name:
            raise self.invalid(table.where, "the attribute has no name")
        kind = int(table.scalar(2, "<i", 0, "type"))
        kinds = onnx.AttributeProto.AttributeType
        if not kinds.FLOAT <= kind <= kinds.GRAPHS:
            raise self.invalid(
                table.where,
                f"attribute {name!r} has type {kind}; ORT-format attributes are FLOAT, INT, STRING, TENSOR, GRAPH, "
                "FLOATS, INTS, STRINGS, TENSORS or GRAPHS (1-10)",
            )
        attribute = onnx.AttributeProto(
            name=name, doc_string=table.string(1, "doc_string"), type=kinds.Name(kinds.ValueType(kind))
        )
        if kind == kinds.FLOAT:
            attribute.f = float(table.scalar(3, "<f", 0.0, "f"))
        elif kind == kinds.INT:
            attribute.i = int(table.scalar(4, "<q", 0, "i"))
        elif kind == kinds.STRING:
            attribute.s = table.byte_string(5, "s") or b""
        elif kind == kinds.TENSOR:
            attribute.t.CopyFrom(self.tensor(self.required(table, table.table(6, "t"), "t")))
        elif kind == kinds.GRAPH:
            attribute.g.CopyFrom(self.graph(self.required(table, table.table(7, "g"), "g")))
        elif kind == kinds.FLOATS:
            attribute.floats.extend(table.float32s(8, "floats") or [])
        elif kind == kinds.INTS:
            attribute.ints.extend(table.int64s(9, "ints") or [])
        elif kind == kinds.STRINGS:
            attribute.strings.extend(table.byte_strings(10, "strings") or [])
        elif kind == kinds.TENSORS:
            attribute.tensors.extend(self.tensor(tensor) for tensor in table.tables(11, "tensors") or [])
        else:  # GRAPHS
            attribute.graphs.extend(self.graph(graph) for graph in table.tables(12, "graphs") or [])
        return attribute

    def required(self, parent: Table, child: Table | None, field: str) -> Table:
        """child, or an error naming the missing field."""
        if child is None:
            raise self.invalid(parent.where, f"{field} is missing")
        return child

    def tensor(self, table: Table) -> onnx.TensorProto:
        """ort.fbs ``Tensor``: its data's size checked against its dims and element type."""
        name = table.string(0, "name") or ""
        dims = table.int64s(2, "dims") or []
        data_type = int(table.scalar(3, "<i", 0, "data_type"))
        label = f"{table.where} ({name!r})"
        if int(table.scalar(6, "<q", -1, "external_data_offset")) >= 0:
            raise self.invalid(
                label,
                "the tensor's data is in an external file (external_data_offset), which ORT-format models do not "
                "have: ORT writes their initializers' data inside the model",
            )
        if any(dim < 0 for dim in dims):
            raise self.invalid(label, f"dims {dims} has a negative dimension")
        count = math.prod(dims)
        tensor = onnx.TensorProto(name=name, doc_string=table.string(1, "doc_string"), data_type=data_type)
        tensor.dims.extend(dims)
        if data_type == _STRING:
            strings = table.byte_strings(5, "string_data") or []
            if len(strings) != count:
                raise self.invalid(label, f"holds {len(strings)} strings, but dims {dims} need {count}")
            tensor.string_data.extend(strings)
            return tensor
        if data_type not in _RAW_ITEMSIZE:
            raise self.invalid(label, f"element type {elem_type_name(data_type)} ({data_type}) is not a tensor type")
        raw = table.ubytes(4, "raw_data") or b""
        if len(raw) != count * _RAW_ITEMSIZE[data_type]:
            raise self.invalid(
                label,
                f"holds {len(raw)} bytes of raw_data, but dims {dims} of {elem_type_name(data_type)} need "
                f"{count * _RAW_ITEMSIZE[data_type]}",
            )
        tensor.raw_data = raw
        return tensor

    def sparse_tensor(self, table: Table) -> onnx.SparseTensorProto:
        """ort.fbs ``SparseTensor``."""
        sparse = onnx.SparseTensorProto()
        sparse.values.CopyFrom(self.tensor(self.required(table, table.table(0, "values"), "values")))
        sparse.indices.CopyFrom(self.tensor(self.required(table, table.table(1, "indices"), "indices")))
        sparse.dims.extend(table.int64s(2, "dims") or [])
        return sparse

    def value_info(self, table: Table) -> onnx.ValueInfoProto:
        """ort.fbs ``ValueInfo``."""
        name = table.string(0, "name")
        if name is None:
            raise self.invalid(table.where, "the value has no name")
        info = onnx.ValueInfoProto(name=name, doc_string=table.string(1, "doc_string"))
        type_info = table.table(2, "type")
        if type_info is not None:
            info.type.CopyFrom(self.type_proto(type_info))
        return info

    def type_proto(self, table: Table) -> onnx.TypeProto:
        """ort.fbs ``TypeInfo``: a tensor, sequence or map type."""
        proto = onnx.TypeProto(denotation=table.string(0, "denotation"))
        kind = int(table.scalar(1, "<B", 0, "value_type"))
        value = table.table(2, "value")
        if kind == 0 or value is None:
            return proto
        if kind == _TYPE_INFO_TENSOR:
            proto.tensor_type.elem_type = int(value.scalar(0, "<i", 0, "elem_type"))
            shape = value.table(1, "shape")
            if shape is not None:
                proto.tensor_type.shape.CopyFrom(self.shape(shape))
        elif kind == _TYPE_INFO_SEQUENCE:
            proto.sequence_type.elem_type.CopyFrom(
                self.type_proto(self.required(value, value.table(0, "elem_type"), "elem_type"))
            )
        elif kind == _TYPE_INFO_MAP:
            proto.map_type.key_type = int(value.scalar(0, "<i", 0, "key_type"))
            proto.map_type.value_type.CopyFrom(
                self.type_proto(self.required(value, value.table(1, "value_type"), "value_type"))
            )
        else:
            raise self.invalid(table.where, f"type kind {kind} is none of tensor (1), sequence (2) or map (3)")
        return proto

    def shape(self, table: Table) -> onnx.TensorShapeProto:
        """ort.fbs ``Shape``: each dim a value, a symbolic name or unknown."""
        shape = onnx.TensorShapeProto()
        for dim_table in table.tables(0, "dim") or []:
            dim = shape.dim.add(denotation=dim_table.string(1, "denotation"))
            value = dim_table.table(0, "value")
            if value is None:
                continue
            kind = int(value.scalar(0, "<b", 0, "dim_type"))
            if kind == _DIM_VALUE:
                dim.dim_value = int(value.scalar(1, "<q", 0, "dim_value"))
            elif kind == _DIM_PARAM:
                dim.dim_param = value.string(2, "dim_param") or ""
        return shape
