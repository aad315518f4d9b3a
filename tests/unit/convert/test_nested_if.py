"""Ifs on run-time conditions nested deep: eager runs choose each branch in Python (any depth, with
gradients); a compiled run past the depth Dynamo traces raises a clear error, not a RecursionError."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ort_torch_train.convert.graph import TensorSpec, convert_graph

DEPTH = 25
FLOAT, BOOL = TensorProto.FLOAT, TensorProto.BOOL


def _branch(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(node.output[0], FLOAT, [2])])


def nested_if_model(depth: int = DEPTH) -> onnx.ModelProto:
    """``depth`` Ifs on c, each nested in the then-branch of the one above: Sin(x) when c, else -x."""
    then = _branch(helper.make_node("Sin", ["x"], ["sin"]), "innermost")
    for level in range(depth):
        node = helper.make_node(
            "If",
            ["c"],
            [f"if{level}"],
            then_branch=then,
            else_branch=_branch(helper.make_node("Neg", ["x"], [f"neg{level}"]), f"else{level}"),
        )
        then = _branch(node, f"then{level}")
    inputs = [helper.make_tensor_value_info("x", FLOAT, [2]), helper.make_tensor_value_info("c", BOOL, [])]
    graph = helper.make_graph(list(then.node), "nested_if", inputs, list(then.output))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _convert() -> torch.fx.GraphModule:
    examples = [torch.ones(2), torch.tensor(True)]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in examples]
    return convert_graph(nested_if_model().graph, {"": 17}, specs, training=True, examples=examples)


def test_ifs_nested_deep_run_eagerly_with_gradients() -> None:
    module = _convert()
    x = torch.tensor([0.5, -1.0])
    for condition, expected, derivative in (
        (True, torch.sin, torch.cos),
        (False, torch.neg, lambda t: -torch.ones_like(t)),
    ):
        leaf = x.clone().requires_grad_(True)
        (y,) = module(leaf, torch.tensor(condition))
        torch.testing.assert_close(y, expected(x))
        y.sum().backward()
        torch.testing.assert_close(leaf.grad, derivative(x))


@pytest.mark.compile
def test_ifs_nested_past_what_dynamo_traces_give_a_clear_error_when_compiled() -> None:
    module = _convert()
    compiled = torch.compile(lambda *args: module(*args), fullgraph=True, dynamic=False)
    with pytest.raises(Exception, match=f"nested {DEPTH} deep; torch.compile traces at most 10 levels") as caught:
        compiled(torch.ones(2), torch.tensor(True))
    assert not isinstance(caught.value, RecursionError) and "RecursionError" not in str(caught.value)
