"""BitCast keeps its input's shape (rank 0 included) and its dtype survives the view-chain fusion."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.adapter_harness import convert_model


def _model(nodes: list[onnx.NodeProto], input_shape: list[int], output_type: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "bit_cast",
        [helper.make_tensor_value_info("in0", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("y", output_type, None)],
        [numpy_helper.from_array(np.array([], np.int64), "scalar"), numpy_helper.from_array(np.array([0]), "axis0")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])


TO_INT32 = {"to": TensorProto.INT32}
CASES = {
    "scalar": ([helper.make_node("BitCast", ["in0"], ["y"], **TO_INT32)], []),
    "reshaped to a scalar, then cast": (
        [helper.make_node("Reshape", ["in0", "scalar"], ["r"]), helper.make_node("BitCast", ["r"], ["y"], **TO_INT32)],
        [1],
    ),
    "cast, then unsqueezed": (
        [helper.make_node("BitCast", ["in0"], ["c"], **TO_INT32), helper.make_node("Unsqueeze", ["c", "axis0"], ["y"])],
        [],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bit_cast_keeps_shape_and_dtype(case: str) -> None:
    nodes, shape = CASES[case]
    x = np.array(1.5, np.float32).reshape(shape)
    module, tensors = convert_model(_model(nodes, shape, TensorProto.INT32), [x])
    got = module(*tensors)[0].numpy()
    expected = x.view(np.int32).reshape(() if case.startswith("reshaped") else shape)
    expected = expected[None] if case.endswith("unsqueezed") else expected
    assert got.dtype == np.int32 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
