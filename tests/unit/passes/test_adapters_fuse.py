"""The fusion pass: matmul(x, W.T) + b -> F.linear, scaled masked attention -> F.scaled_dot_product_attention."""

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper

from tests.helpers.adapter_harness import convert_model, rand, reference_outputs

F32 = onnx.TensorProto.FLOAT


def _model(nodes, inputs, initializers=(), opset=17):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F32, list(v.shape)) for n, v in inputs],
        [helper.make_tensor_value_info("out0", F32, None)],
        [onnx.numpy_helper.from_array(v, n) for n, v in initializers],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _targets(gm):
    return [node.target for node in gm.graph.nodes if node.op == "call_function"]


def _check_against_reference(model, feeds, atol=1e-5):
    arrays = [v for _, v in feeds]
    expected = reference_outputs(model, arrays)[0]
    gm, tensors = convert_model(model, arrays, training=True)
    leaves = [t.clone().requires_grad_() for t in tensors]
    got = gm(*leaves)[0]
    np.testing.assert_allclose(got.detach().numpy(), expected, atol=atol, rtol=atol)
    return gm, leaves, got


def test_matmul_with_transposed_weight_and_bias_becomes_linear():
    nodes = [
        helper.make_node("Transpose", ["in1"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["in0", "wt"], ["y"]),
        helper.make_node("Add", ["in2", "y"], ["out0"]),
    ]
    feeds = [("in0", rand(2, 3, 4)), ("in1", rand(5, 4, seed=1)), ("in2", rand(5, seed=2))]
    gm, (x, w, b), got = _check_against_reference(_model(nodes, feeds), feeds)
    assert _targets(gm) == [F.linear]
    got.sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(2, 3, 5).reshape(-1, 5).T @ x.detach().reshape(-1, 4))
    torch.testing.assert_close(b.grad, torch.full((5,), 6.0))


def test_matmul_with_a_wider_bias_is_not_fused_into_linear():
    nodes = [
        helper.make_node("Transpose", ["in1"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["in0", "wt"], ["y"]),
        helper.make_node("Add", ["y", "in2"], ["out0"]),
    ]
    feeds = [("in0", rand(3, 4)), ("in1", rand(5, 4, seed=1)), ("in2", rand(2, 3, 5, seed=2))]
    gm, _, _ = _check_against_reference(_model(nodes, feeds), feeds)
    assert torch.add in _targets(gm)


def _attention_nodes(mask: bool, softmax_output: str = "p"):
    nodes = [
        helper.make_node("Transpose", ["in1"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["in0", "s"], ["qs"]),
        helper.make_node("Mul", ["kt", "s"], ["kts"]),
        helper.make_node("MatMul", ["qs", "kts"], ["scores"]),
    ]
    if mask:
        nodes.append(helper.make_node("Add", ["scores", "in3"], ["masked"]))
    nodes.append(helper.make_node("Softmax", ["masked" if mask else "scores"], [softmax_output], axis=-1))
    return nodes


def test_scaled_attention_with_additive_mask_becomes_sdpa():
    scale = np.array(8**-0.25, np.float32)
    mask = np.triu(np.full((5, 5), -np.inf, np.float32), 1)
    nodes = _attention_nodes(mask=True) + [helper.make_node("MatMul", ["p", "in2"], ["out0"])]
    feeds = [
        ("in0", rand(2, 3, 5, 8)),
        ("in1", rand(2, 3, 5, 8, seed=1)),
        ("in2", rand(2, 3, 5, 4, seed=2)),
        ("in3", mask),
    ]
    gm, leaves, got = _check_against_reference(_model(nodes, feeds, [("s", scale)]), feeds)
    assert F.scaled_dot_product_attention in _targets(gm) and torch.softmax not in _targets(gm)
    q, k, v, m = (t.detach().double().requires_grad_() for t in leaves)
    expected = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + m, -1) @ v
    got.sum().backward()
    expected.sum().backward()
    for fused, reference in zip(leaves[:3], (q, k, v)):
        torch.testing.assert_close(fused.grad.double(), reference.grad, atol=1e-5, rtol=1e-5)


def test_attention_whose_probabilities_are_also_an_output_is_left_alone():
    nodes = _attention_nodes(mask=False, softmax_output="out0") + [helper.make_node("MatMul", ["out0", "in2"], ["o"])]
    feeds = [("in0", rand(1, 2, 5, 8)), ("in1", rand(1, 2, 5, 8, seed=1)), ("in2", rand(1, 2, 5, 4, seed=2))]
    model = _model(nodes, feeds, [("s", np.array(0.5, np.float32))])
    model.graph.output.append(helper.make_tensor_value_info("o", F32, None))
    gm, _, _ = _check_against_reference(model, feeds)
    assert torch.softmax in _targets(gm) and F.scaled_dot_product_attention not in _targets(gm)


def test_masked_fill_attention_becomes_sdpa_with_a_boolean_mask():
    hidden = ~np.tril(np.ones((5, 5), bool))
    nodes = [
        helper.make_node("Transpose", ["in1"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["in0", "kt"], ["scores"]),
        helper.make_node("Div", ["scores", "d"], ["scaled"]),
        helper.make_node("Where", ["hidden", "fill", "scaled"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "in2"], ["out0"]),
    ]
    feeds = [("in0", rand(2, 3, 5, 8)), ("in1", rand(2, 3, 5, 8, seed=1)), ("in2", rand(2, 3, 5, 4, seed=2))]
    constants = [("d", np.array(8**0.5, np.float32)), ("fill", np.array(-np.inf, np.float32)), ("hidden", hidden)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F32, list(v.shape)) for n, v in feeds],
        [helper.make_tensor_value_info("out0", F32, None)],
        [onnx.numpy_helper.from_array(v, n) for n, v in constants],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    gm, leaves, got = _check_against_reference(model, feeds)
    assert F.scaled_dot_product_attention in _targets(gm) and torch.where not in _targets(gm)
    got.sum().backward()
    assert all(leaf.grad is not None and torch.isfinite(leaf.grad).all() for leaf in leaves)
