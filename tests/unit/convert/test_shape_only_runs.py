"""The conversion's example run gives a node with static output shapes and floating-point run-time inputs
(or a quantised weight's packed integers)
its output shapes from a run on meta tensors: no tensor of its output's size is computed, and the converted
graph computes what the ONNX graph does (also where integers are later made from those floats)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ort_torch_train.adapters.matmul_nbits import CHUNK_ELEMENTS
from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.convert.meta_keys import MATRIX_PRODUCTS
from ort_torch_train.errors import IndexRangeError
from ort_torch_train.torch_internals import TorchDispatchMode
from tests.unit.adapters.test_adapters_gather_block_quantized import quantized_table
from tests.unit.adapters.test_adapters_genai_ops import quantized_weight

onnxruntime = pytest.importorskip("onnxruntime")

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
ROWS, WIDTH = 1024, 256  # the output is larger than the weight (which the conversion copies)


class _LargestMade(TorchDispatchMode):
    """The element count of the largest new CPU tensor storage an op run under it made (not a view)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        read = {arg.untyped_storage().data_ptr() for arg in args if isinstance(arg, torch.Tensor) and not arg.is_meta}
        for made in result if isinstance(result, (tuple, list)) else [result]:
            if (
                isinstance(made, torch.Tensor)
                and made.device.type == "cpu"
                and made.untyped_storage().data_ptr() not in read
            ):
                self.largest = max(self.largest, made.untyped_storage().nbytes() // 4)
        return result


def _convert(model: onnx.ModelProto, examples: list[torch.Tensor], shape_only_runs: bool = True):
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in examples]
    opsets = {o.domain: o.version for o in model.opset_import}
    return convert_graph(model.graph, opsets, specs, training=True, examples=examples, shape_only_runs=shape_only_runs)


def _model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, weights: dict[str, np.ndarray]):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _projection_model() -> onnx.ModelProto:
    """``Softmax(Relu(x @ w) + x)``, x [ROWS, WIDTH]."""
    weight = np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32) / WIDTH
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Relu", ["p"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"], axis=-1),
    ]
    inputs = [helper.make_tensor_value_info("x", FLOAT, [ROWS, WIDTH])]
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", FLOAT, [ROWS, WIDTH])], {"w": weight})


def test_float_nodes_make_no_output_sized_tensor_and_the_graph_computes_the_same():
    model = _projection_model()
    x = torch.randn(ROWS, WIDTH)
    with _LargestMade() as shape_only:
        module = _convert(model, [x])
    with _LargestMade() as every_node:
        _convert(model, [x], shape_only_runs=False)
    assert every_node.largest >= ROWS * WIDTH  # the example run computed the products
    assert shape_only.largest < ROWS * WIDTH  # only shapes (and one-element zeros)
    assert MATRIX_PRODUCTS.get(module, None) == [ROWS * WIDTH * WIDTH]  # counted once, from the meta run
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(module(x)[0].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_integers_made_from_floats_and_value_dependent_shapes_convert_and_compute_the_same():
    """ArgMax of a product indexes an embedding (its example sees zeros); NonZero of a product decides a
    shape (the graph's nodes then all run on their examples)."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((16, 8)).astype(np.float32)
    weight = rng.standard_normal((8, 16)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["best"], axis=-1, keepdims=0),
        helper.make_node("Gather", ["table", "best"], ["y"]),
        helper.make_node("Relu", ["scores"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"]),
    ]
    inputs = [helper.make_tensor_value_info("ids", INT64, [4])]
    outputs = [helper.make_tensor_value_info("y", FLOAT, [4, 8]), helper.make_tensor_value_info("where", INT64, None)]
    ids = torch.tensor([3, 0, 15, 7])
    model = _model(nodes, inputs, outputs, {"table": table, "w": weight})
    module = _convert(model, [ids])
    expected = ReferenceEvaluator(model).run(None, {"ids": ids.numpy()})
    for got, want in zip(module(ids), expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    without_nonzero = _model(nodes[:4], inputs, outputs[:1], {"table": table, "w": weight})
    (got,) = _convert(without_nonzero, [ids])(ids)
    np.testing.assert_allclose(got.numpy(), expected[0], rtol=1e-6)


VOCAB, HIDDEN, OUT, BLOCK = 8192, 256, 8192, 32  # a packed table and a packed weight of 1 MiB each


def _int4_model() -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """``MatMulNBits(GatherBlockQuantized(table, ids), weight)`` whose packed table and weight (and the
    weight's zero points) are graph inputs, as a LoRA model's checkpoint parameters are, and its feeds."""
    ids = np.array([[5, 0, 8191, 17], [3, 3, 100, 4000]], dtype=np.int64)
    table, table_scales, _ = quantized_table((VOCAB, HIDDEN), 4, BLOCK, zero_points=False)
    weight, weight_scales, zero = quantized_weight(HIDDEN, OUT, 4, BLOCK, zero_points=True, seed=1)
    feeds = [ids, table, table_scales, weight, weight_scales, zero]
    names = ["ids", "table", "table_scales", "weight", "weight_scales", "zero"]
    nodes = [
        helper.make_node(
            "GatherBlockQuantized", ["table", "ids", "table_scales"], ["e"], domain="com.microsoft",
            bits=4, block_size=BLOCK, quantize_axis=1,
        ),
        helper.make_node(
            "MatMulNBits", ["e", "weight", "weight_scales", "zero"], ["y"], domain="com.microsoft",
            K=HIDDEN, N=OUT, bits=4, block_size=BLOCK, accuracy_level=0,
        ),
    ]  # fmt: skip
    inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
        for name, value in zip(names, feeds)
    ]
    outputs = [helper.make_tensor_value_info("y", FLOAT, [*ids.shape, OUT])]
    graph = helper.make_graph(nodes, "int4", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model, feeds


def test_packed_weights_read_at_run_time_make_no_float_weight_and_the_graph_computes_the_same():
    """The int4 build's MatMulNBits and GatherBlockQuantized, their packed weights checkpoint parameters
    (uint8 run-time inputs): the example run dequantises neither weight; the ids are still range-checked."""
    model, feeds = _int4_model()
    examples = [torch.from_numpy(value) for value in feeds]
    with _LargestMade() as shape_only:
        module = _convert(model, examples)
    with _LargestMade() as every_node:
        module_every_node = _convert(model, examples, shape_only_runs=False)
    assert every_node.largest >= min(CHUNK_ELEMENTS, HIDDEN * OUT)  # a block of the float weight (or all of it)
    assert shape_only.largest < ROWS * WIDTH  # the gathered rows only: 8 x 256 values
    assert MATRIX_PRODUCTS.get(module, None) == MATRIX_PRODUCTS.get(module_every_node, None)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {vi.name: value for vi, value in zip(model.graph.input, feeds)})
    (got,) = module(*examples)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    examples[0] = torch.tensor([[5, 0, VOCAB, 1]])
    with pytest.raises(IndexRangeError, match="'ids' holds 8192, outside the valid range"):
        _convert(model, examples)
