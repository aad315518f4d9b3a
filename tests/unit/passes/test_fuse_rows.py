"""Row-wise regions on 2-D activations (passes/fuse_rows.py): which regions are rewritten, and that
values and gradients stay those of the 3-D graph."""

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper

from ort_torch_train.passes.fuse_rows import fuse_row_regions
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.pipeline import run_passes
from tests.helpers.adapter_harness import convert_model, rand, reference_outputs

F32 = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs=("out0",), constants=(), opset=17):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F32, list(v.shape)) for n, v in inputs],
        [helper.make_tensor_value_info(name, F32, None) for name in outputs],
        [onnx.numpy_helper.from_array(np.float32(value), name) for name, value in constants],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _linear(x, w, out):
    return [
        helper.make_node("Transpose", [w], [f"{w}_t"], perm=[1, 0]),
        helper.make_node("MatMul", [x, f"{w}_t"], [out]),
    ]


def _gelu(x, out, as_op: bool):
    if as_op:
        return [helper.make_node("Gelu", [x], [out])]
    return [
        helper.make_node("Div", [x, "sqrt2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["shifted"]),
        helper.make_node("Mul", [x, "shifted"], ["doubled"]),
        helper.make_node("Mul", ["doubled", "half"], [out]),
    ]


def _rewritten_and_checked(model, feeds):
    """The converted graph before and after fuse_row_regions; asserts their outputs and gradients agree
    with each other and the outputs with ONNX's reference evaluator."""
    arrays = [v for _, v in feeds]
    expected = reference_outputs(model, arrays)
    results = []
    for rows in (False, True):
        gm, tensors = convert_model(model, arrays, training=True)
        gm = run_passes(gm, [fuse_row_regions], torch.device("cpu")) if rows else gm
        leaves = [t.clone().requires_grad_() for t in tensors]
        outputs = gm(*leaves)
        sum(output.sum() * (i + 1) for i, output in enumerate(outputs)).backward()
        for output, reference in zip(outputs, expected):
            np.testing.assert_allclose(output.detach().numpy(), reference, atol=1e-5, rtol=1e-5)
        results.append((gm, [output.detach() for output in outputs], [leaf.grad for leaf in leaves]))
    (_, plain, plain_grads), (gm, got, got_grads) = results
    for output, reference in zip(got, plain):
        assert output.shape == reference.shape
        torch.testing.assert_close(output, reference, atol=1e-6, rtol=1e-6)
    for grad, reference in zip(got_grads, plain_grads):
        torch.testing.assert_close(grad, reference, atol=1e-6, rtol=1e-6)
    return gm


def _linear_input_ranks(gm):
    return [node.args[0].meta["val"].dim() for node in gm.graph.nodes if node.target is F.linear]


@pytest.mark.parametrize("gelu_op", [False, True], ids=["erf", "Gelu"])
def test_a_residual_block_runs_on_rows_and_gives_its_3d_output_back(gelu_op):
    """x + W2 gelu(W1 layer_norm(x)) (GELU written with Erf, or the Gelu op: a call with ``approximate=``),
    then a Transpose (not row-wise): the linears take 2-D inputs, the Transpose gets the 3-D result, and a
    second output read inside the region keeps its shape."""
    x, gamma, beta, w1, w2 = "in0", "in1", "in2", "in3", "in4"
    nodes = [
        helper.make_node("LayerNormalization", [x, gamma, beta], ["normed"], axis=-1),
        *_linear("normed", w1, "h"),
        *_gelu("h", "r", gelu_op),
        *_linear("r", w2, "y"),
        helper.make_node("Add", [x, "y"], ["out1"]),
        helper.make_node("Transpose", ["out1"], ["out0"], perm=[1, 0, 2]),
    ]
    feeds = [
        (x, rand(2, 3, 4)),
        (gamma, rand(4, seed=1)),
        (beta, rand(4, seed=2)),
        (w1, rand(6, 4, seed=3)),
        (w2, rand(4, 6, seed=4)),
    ]
    constants = [] if gelu_op else [("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)]
    gm = _rewritten_and_checked(_model(nodes, feeds, ("out0", "out1"), constants, 20 if gelu_op else 17), feeds)
    assert _linear_input_ranks(gm) == [2, 2]
    gelu = [node for node in gm.graph.nodes if node.target is F.gelu]
    assert len(gelu) == 1 and gelu[0].meta["val"].dim() == 2
    assert FUSIONS.get(gm, Counter())["row_linear"] == 2


def test_a_region_without_a_linear_and_a_per_row_operand_are_left_alone():
    """relu(x) + x has no linear: untouched. x * s with s of shape [2, 3, 1] scales whole rows: it stays
    3-D, and the linear reading it is a region of its own."""
    x, s, w = "in0", "in1", "in2"
    nodes = [
        helper.make_node("Relu", [x], ["r"]),
        helper.make_node("Add", ["r", x], ["out1"]),
        helper.make_node("Mul", [x, s], ["scaled"]),
        *_linear("scaled", w, "out0"),
    ]
    feeds = [(x, rand(2, 3, 4)), (s, rand(2, 3, 1, seed=1)), (w, rand(5, 4, seed=2))]
    gm = _rewritten_and_checked(_model(nodes, feeds, ("out0", "out1")), feeds)
    assert _linear_input_ranks(gm) == [2]
    ranks = {node.target: node.meta["val"].dim() for node in gm.graph.nodes if node.op == "call_function"}
    assert ranks[torch.relu] == ranks[torch.add] == ranks[torch.mul] == 3
