"""Opset-23 Attention and RotaryEmbedding: values against ONNX's reference, float64 gradchecks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.adapter_harness import check, check_gradients, convert_model, one_node_model, rand

Q, K, V = rand(1, 2, 3, 4), rand(1, 1, 5, 4), rand(1, 1, 5, 3)  # GQA: 2 query heads over 1 KV head
CAUSAL_PAST = dict(is_causal=1)
NO_ROW_FOR_QUERY_1 = np.array([[True, True, False, True, True], [False] * 5, [True] * 5])


@pytest.mark.slow
@pytest.mark.parametrize(
    "inputs, outputs, attrs",
    [
        ([Q, K, V], 1, {}),
        ([Q, K, V], 1, {"is_causal": 1, "scale": 0.3}),
        ([Q, K, V, rand(3, 5)], 1, {}),
        ([Q, K, V, NO_ROW_FOR_QUERY_1], 1, {}),
        ([Q, K, V, None, rand(1, 1, 2, 4), rand(1, 1, 2, 3)], 3, CAUSAL_PAST),
        ([Q, K, V, rand(3, 5)], 4, {"softcap": 2.0, "qk_matmul_output_mode": 2}),
        ([rand(1, 3, 8), rand(1, 5, 4), rand(1, 5, 4)], 1, {"q_num_heads": 4, "kv_num_heads": 2}),
    ],
)
def test_attention_matches_reference_and_gradchecks(inputs, outputs, attrs):
    check("Attention", inputs, outputs=outputs, opset=23, atol=1e-5, **attrs)
    check_gradients("Attention", inputs, outputs=outputs, opset=23, **attrs)


def test_fully_masked_rows_give_zero_output_and_finite_gradients():
    inputs = [Q, K, V, NO_ROW_FOR_QUERY_1]
    gm, tensors = convert_model(one_node_model("Attention", inputs, opset=23), inputs, training=True)
    q = tensors[0].clone().requires_grad_(True)
    (y,) = gm(q, *tensors[1:])
    assert torch.equal(y[:, :, 1], torch.zeros_like(y[:, :, 1]))
    y.sum().backward()
    assert torch.isfinite(q.grad).all()


X4 = rand(2, 1, 4, 8)  # (batch, heads, seq, head_size)
COS, SIN = np.cos(rand(6, 4)), np.sin(rand(6, 4))
POSITIONS = np.array([[0, 2, 1, 5], [3, 3, 4, 0]], dtype=np.int64)


@pytest.mark.parametrize(
    "inputs, attrs",
    [
        ([X4, COS, SIN, POSITIONS], {}),
        ([X4, COS, SIN, POSITIONS], {"interleaved": 1}),
        ([X4, COS[:, :2], SIN[:, :2], POSITIONS], {"rotary_embedding_dim": 4, "interleaved": 1}),
        ([rand(2, 4, 16), COS[:4][None].repeat(2, 0), SIN[:4][None].repeat(2, 0)], {"num_heads": 2}),
    ],
)
def test_rotary_embedding_matches_reference_and_gradchecks(inputs, attrs):
    check("RotaryEmbedding", inputs, opset=23, atol=1e-5, **attrs)
    check_gradients("RotaryEmbedding", inputs, opset=23, **attrs)


def test_flex_attention_with_a_score_mod_subgraph_matches_reference_and_gradchecks():
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from ort_torch_train.convert.graph import TensorSpec, convert_graph
    from ort_torch_train.passes.pipeline import fuse_converted

    softcap = helper.make_graph(
        [helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("Mul", ["t", "two"], ["capped"])],
        "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.DOUBLE, None)],
        [helper.make_tensor_value_info("capped", TensorProto.DOUBLE, None)],
        [helper.make_tensor("two", TensorProto.DOUBLE, [], [2.0])],
    )
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview", score_mod=softcap)
    shapes = {"q": (1, 2, 3, 4), "k": (1, 1, 5, 4), "v": (1, 1, 5, 3)}
    graph = helper.make_graph(
        [node],
        "flex",
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
    )
    opsets = {"": 26, "ai.onnx.preview": 1}
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    inputs = [torch.from_numpy(rand(*s, seed=i).astype(np.float64)) for i, s in enumerate(shapes.values())]
    gm = convert_graph(graph, opsets, [TensorSpec(tuple(t.shape), t.dtype) for t in inputs], training=True)
    fuse_converted(gm, torch.device("cpu"))
    (expected,) = ReferenceEvaluator(model).run(None, {n: t.numpy() for n, t in zip(shapes, inputs)})
    np.testing.assert_allclose(gm(*inputs)[0].detach().numpy(), expected, rtol=1e-10)
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    assert torch.autograd.gradcheck(lambda *xs: gm(*xs)[0], leaves)
