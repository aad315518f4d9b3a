"""Graph inputs named like a Python builtin (``input``) or not as identifiers (``0.weight``) become placeholders that
each read their own argument: FX renames ``input``'s node, and that name must not be another input's."""

from __future__ import annotations

import torch
from onnx import TensorProto, helper

from ort_torch_train.convert.graph import TensorSpec, convert_graph


def test_an_input_named_input_followed_by_parameters_reads_each_argument() -> None:
    names = ["input", "0.weight", "0.bias", "input_1", "max"]
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "0.weight", "0.bias"], ["y"], transB=1),
            helper.make_node("Add", ["y", "input_1"], ["z"]),
            helper.make_node("Mul", ["z", "max"], ["out"]),
        ],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    shapes = [(4, 3), (2, 3), (2,), (4, 2), (4, 2)]
    values = [torch.randn(shape) for shape in shapes]
    module = convert_graph(
        graph, {"": 17}, [TensorSpec(shape, torch.float32) for shape in shapes], training=False, examples=values
    )
    x, weight, bias, added, scale = values
    expected = (x @ weight.T + bias + added) * scale
    torch.testing.assert_close(module(*values)[0], expected, rtol=0, atol=1e-6)
