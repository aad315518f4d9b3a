"""ONNX's backend node tests as the converter's conformance suite, and run-time shape inputs.

Every node case with tensor inputs and outputs is converted and compared with ONNX's expected
outputs (tests/helpers/conformance.py). A wrong number or an error fails unless the case is listed with its
reason in tests/helpers/conformance_known_failures.txt; a listed case that now passes fails too (so the file
stays exact), and so does a drop of the passing count (a case that newly became unsupported).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.passes.pipeline import fuse_converted
from tests.helpers.conformance import DOCS_PAGE, known_failures, markdown, run_all

PASSING_AT_LEAST = 1631


@pytest.fixture(scope="session")
def outcomes():
    return run_all()


@pytest.mark.slow
def test_no_wrong_numbers_and_no_unlisted_failures(outcomes):
    known = known_failures()
    unexpected = [
        f"{o.case}: {o.status} {o.detail}" for o in outcomes if o.status in ("wrong", "error") and o.case not in known
    ]
    assert not unexpected, "\n".join(unexpected)


@pytest.mark.slow
def test_known_failures_still_fail(outcomes):
    by_case = {o.case: o for o in outcomes}
    known = known_failures()
    assert all(reason for reason in known.values()), "every known failure needs a reason"
    fixed = [case for case in known if case in by_case and by_case[case].status not in ("wrong", "error")]
    stale = [case for case in known if case not in by_case]
    assert not fixed, f"now passing or unsupported, remove from the known-failures file: {fixed}"
    assert not stale, f"no such node case: {stale}"


@pytest.mark.slow
def test_passing_count_does_not_drop(outcomes):
    passing = sum(o.status == "pass" for o in outcomes)
    assert passing >= PASSING_AT_LEAST, f"{passing} node cases pass, expected at least {PASSING_AT_LEAST}"


@pytest.mark.slow
def test_docs_page_has_the_current_figures(outcomes):
    assert DOCS_PAGE.read_text() == markdown(outcomes), (
        "docs/conformance.md is stale: run python -m tests.helpers.conformance --markdown docs/conformance.md"
    )


def _one_node(op_type: str, inputs: list[tuple[str, int, list[int]]], **attrs) -> onnx.GraphProto:
    node = helper.make_node(op_type, [name for name, _, _ in inputs], ["y"], **attrs)
    return helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
    )


@pytest.mark.parametrize(
    "op_type, data, first, second",
    [
        ("Reshape", np.arange(24, dtype=np.float32).reshape(2, 3, 4), [4, 6], [3, 8]),
        ("Expand", np.arange(3, dtype=np.float32).reshape(3, 1), [3, 4], [2, 3, 2]),
        ("Tile", np.arange(6, dtype=np.float32).reshape(2, 3), [1, 2], [3, 1]),
    ],
)
def test_shape_inputs_are_read_at_run_time(op_type, data, first, second):
    """One conversion (for one input signature) serves different values of a shape input."""
    graph = _one_node(op_type, [("x", TensorProto.FLOAT, list(data.shape)), ("s", TensorProto.INT64, [len(first)])])
    x = torch.from_numpy(data)
    specs = [TensorSpec(tuple(x.shape), x.dtype), TensorSpec((len(first),), torch.int64)]
    module = convert_graph(graph, {"": 18}, specs, training=False, examples=[x, torch.tensor(first)])
    fuse_converted(module, torch.device("cpu"))
    reference = onnx.reference.ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    for shape in (first, second):
        (expected,) = reference.run(None, {"x": data, "s": np.array(shape, dtype=np.int64)})
        (actual,) = module(x, torch.tensor(shape))
        np.testing.assert_array_equal(actual.numpy(), expected)


def test_slice_steps_and_resize_sizes_are_read_at_run_time():
    data = np.arange(40, dtype=np.float32).reshape(1, 1, 5, 8)
    x = torch.from_numpy(data)
    slicing = _one_node(
        "Slice",
        [
            ("x", TensorProto.FLOAT, [1, 1, 5, 8]),
            ("b", TensorProto.INT64, [1]),
            ("e", TensorProto.INT64, [1]),
            ("a", TensorProto.INT64, [1]),
            ("st", TensorProto.INT64, [1]),
        ],
    )
    resizing = _one_node(
        "Resize",
        [("x", TensorProto.FLOAT, [1, 1, 5, 8]), ("", 0, []), ("", 0, []), ("sz", TensorProto.INT64, [4])],
        mode="linear",
    )
    cases = [
        (slicing, [[0], [8], [3], [1]], [[7], [-9], [3], [-2]]),
        (resizing, [[1, 1, 10, 16]], [[1, 1, 3, 4]]),
    ]
    for graph, first, second in cases:
        graph.ClearField("input")
        names = [name for name in graph.node[0].input if name]
        graph.input.extend(
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 8])]
            + [helper.make_tensor_value_info(n, TensorProto.INT64, [len(v)]) for n, v in zip(names[1:], first)]
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
        example = [x, *(torch.tensor(v) for v in first)]
        module = convert_graph(
            graph, {"": 19}, [TensorSpec(tuple(t.shape), t.dtype) for t in example], training=False, examples=example
        )
        fuse_converted(module, torch.device("cpu"))
        for values in (first, second):
            feeds = {"x": data, **{n: np.array(v, dtype=np.int64) for n, v in zip(names[1:], values)}}
            (expected,) = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
            (actual,) = module(x, *(torch.tensor(v) for v in values))
            np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_third_party_converter_registration():
    """The docs/converters.md example: an op of one's own domain, registered and converted."""
    from ort_torch_train.adapters import register
    from ort_torch_train.adapters.common import Inline, attributes, result
    from ort_torch_train.adapters.registry import _REGISTRY

    def scaled_tanh(x, scale):
        return scale * torch.tanh(x)

    @register("ScaledTanh", domain="com.example", since=1)
    def convert(node, graph, context):
        return result(Inline(scaled_tanh, attributes(node).get("scale", 1.0)), node)

    try:
        node = helper.make_node("ScaledTanh", ["x"], ["y"], domain="com.example", scale=3.0)
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        )
        x = torch.randn(2, 3, requires_grad=True)
        module = convert_graph(graph, {"": 18, "com.example": 1}, [TensorSpec((2, 3), torch.float32)], training=True)
        fuse_converted(module, torch.device("cpu"))
        (y,) = module(x)
        torch.testing.assert_close(y, 3.0 * torch.tanh(x))
        y.sum().backward()
        assert x.grad is not None
    finally:
        del _REGISTRY[("com.example", "ScaledTanh")]


def test_unsupported_operator_message_points_to_registration():
    from ort_torch_train.convert.registry import check_supported
    from ort_torch_train.errors import UnsupportedOperatorError

    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(UnsupportedOperatorError, match=r"NoSuchOp.*ort_torch_train.adapters.register"):
        check_supported(graph, {"com.example": 1})
