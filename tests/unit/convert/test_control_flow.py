"""If, Loop and Scan: constant conditions inlined, static loops and scans unrolled, run-time ones read at run time."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from ort_torch_train.convert.control_flow import _Cond
from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.convert.meta_keys import MATRIX_PRODUCTS
from ort_torch_train.convert.registry import check_supported
from ort_torch_train.convert.run_time_loops import RunTimeLoop
from ort_torch_train.errors import UnsupportedOperatorError
from ort_torch_train.passes.pipeline import fuse_converted

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _branch(name: str, op_type: str, output: str = "b_out") -> onnx.GraphProto:
    """A branch computing ``op_type(x)`` from the outer value x."""
    return helper.make_graph([helper.make_node(op_type, ["x"], [output])], name, [], [_info(output, FLOAT, [2, 3])])


def _if_model(condition_constant: bool | None) -> onnx.ModelProto:
    nodes = [
        helper.make_node(
            "If", ["c"], ["y"], then_branch=_branch("then", "Sin", "t"), else_branch=_branch("else", "Exp", "e")
        )
    ]
    inputs = [_info("x", FLOAT, [2, 3])]
    initializers = []
    if condition_constant is None:
        inputs.append(_info("c", BOOL, [1]))
    else:
        initializers.append(onnx.numpy_helper.from_array(np.array([condition_constant]), "c"))
    graph = helper.make_graph(nodes, "if", inputs, [_info("y", FLOAT, [2, 3])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _convert(model: onnx.ModelProto, examples: list[torch.Tensor], training: bool = True):
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in examples]
    opsets = {o.domain: o.version for o in model.opset_import}
    check_supported(model.graph, opsets)
    module = convert_graph(model.graph, opsets, specs, training=training, examples=examples)
    fuse_converted(module, torch.device("cpu"))
    return module


def _modules(gm) -> list[type]:
    return [type(m) for m in gm.modules()]


@pytest.mark.parametrize("condition", [True, False])
def test_if_on_a_constant_condition_inlines_the_branch(condition):
    x = torch.randn(2, 3, requires_grad=True)
    gm = _convert(_if_model(condition), [x])
    assert _Cond not in _modules(gm)
    (y,) = gm(x)
    torch.testing.assert_close(y, torch.sin(x) if condition else torch.exp(x))


def test_if_on_a_run_time_condition_runs_under_torch_cond_with_gradients():
    x = torch.randn(2, 3)
    gm = _convert(_if_model(None), [x, torch.tensor([True])])
    assert _Cond in _modules(gm)
    assert MATRIX_PRODUCTS.get(gm, []) is None  # a branch's products are not known: BLAS keeps its threads
    for condition, expected, derivative in ((True, torch.sin, torch.cos), (False, torch.exp, torch.exp)):
        leaf = x.clone().requires_grad_(True)
        (y,) = gm(leaf, torch.tensor([condition]))
        torch.testing.assert_close(y, expected(x))
        y.sum().backward()
        torch.testing.assert_close(leaf.grad, derivative(x))


def test_if_with_branches_of_different_shapes_is_refused_clearly():
    model = _if_model(None)
    model.graph.node[0].attribute[0].g.node[0].op_type = "Flatten"  # then (1, 6), else (2, 3)
    model.graph.node[0].attribute[0].g.node[0].attribute.append(helper.make_attribute("axis", 0))
    with pytest.raises(UnsupportedOperatorError, match="same shapes and dtypes"):
        _convert(model, [torch.randn(2, 3), torch.tensor([True])])


def test_unsupported_operator_inside_a_branch_is_found_before_conversion():
    model = _if_model(None)
    model.graph.node[0].attribute[0].g.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedOperatorError, match="NoSuchOp"):
        check_supported(model.graph, {"": 17})


def _loop_model(trip_is_input: bool, trip: int = 3) -> onnx.ModelProto:
    """acc <- acc * w + iteration; scan output: acc after each step."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["acc_in", "w"], ["scaled"]),
            helper.make_node("Cast", ["i"], ["i_float"], to=FLOAT),
            helper.make_node("Add", ["scaled", "i_float"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan_out"]),
        ],
        "body",
        [_info("i", INT64, []), _info("cond_in", BOOL, []), _info("acc_in", FLOAT, [3])],
        [_info("cond_out", BOOL, []), _info("acc_out", FLOAT, [3]), _info("scan_out", FLOAT, [3])],
    )
    inputs = [_info("acc", FLOAT, [3]), _info("w", FLOAT, [3])]
    initializers = [onnx.numpy_helper.from_array(np.array(True), "c")]
    if trip_is_input:
        inputs.append(_info("M", INT64, []))
    else:
        initializers.append(onnx.numpy_helper.from_array(np.array(trip, dtype=np.int64), "M"))
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "c", "acc"], ["final", "steps"], body=body)],
        "loop",
        inputs,
        [_info("final", FLOAT, [3]), _info("steps", FLOAT, [None, 3])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_with_a_constant_trip_count_is_unrolled_and_trains():
    acc, w = torch.randn(3), torch.randn(3, requires_grad=True)
    model = _loop_model(trip_is_input=False, trip=4)
    gm = _convert(model, [acc, w])
    body_calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    assert len(body_calls) == 4 and RunTimeLoop not in _modules(gm)
    final, steps = gm(acc, w)
    expected = ReferenceEvaluator(model).run(None, {"acc": acc.numpy(), "w": w.detach().numpy()})
    np.testing.assert_allclose(final.detach().numpy(), expected[0], rtol=1e-6)
    np.testing.assert_allclose(steps.detach().numpy(), expected[1], rtol=1e-6)
    final.sum().backward()
    torch.testing.assert_close(w.grad, 4 * acc * w.detach() ** 3 + 2 * w.detach() + 2)  # d(a w^4 + w^2 + 2w + 3)/dw


def test_loop_with_a_run_time_trip_count_reads_it_at_run_time():
    acc, w = torch.randn(3), torch.randn(3)
    model = _loop_model(trip_is_input=True)
    gm = _convert(model, [acc, w, torch.tensor(2)])
    assert RunTimeLoop in _modules(gm)
    for trip in (1, 5):
        final, steps = gm(acc, w, torch.tensor(trip))
        expected = ReferenceEvaluator(model).run(None, {"acc": acc.numpy(), "w": w.numpy(), "M": np.array(trip)})
        np.testing.assert_allclose(final.numpy(), expected[0], rtol=1e-6)
        assert steps.shape == (trip, 3)


def test_scan_is_unrolled_with_directions_and_axes_and_trains():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_out"]), helper.make_node("Tanh", ["s_out"], ["y"])],
        "body",
        [_info("s_in", FLOAT, [2]), _info("row", FLOAT, [2])],
        [_info("s_out", FLOAT, [2]), _info("y", FLOAT, [2])],
    )
    node = helper.make_node(
        "Scan",
        ["s", "x"],
        ["s_final", "ys"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_input_directions=[1],
        scan_output_axes=[-1],
    )
    graph = helper.make_graph(
        [node],
        "scan",
        [_info("s", FLOAT, [2]), _info("x", FLOAT, [2, 4])],
        [_info("s_final", FLOAT, [2]), _info("ys", FLOAT, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    s, x = torch.randn(2), torch.randn(2, 4, requires_grad=True)
    gm = _convert(model, [s, x])
    outputs = gm(s, x)
    state, ys = s.clone(), []
    for column in reversed(range(4)):  # scan_input_directions=[1]: last column first
        state = state + x[:, column]
        ys.append(torch.tanh(state))
    torch.testing.assert_close(outputs[0], state)
    torch.testing.assert_close(outputs[1], torch.stack(ys, -1))
    outputs[1].sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_an_exported_torch_cond_trains_like_pytorch(tmp_path):
    """The dynamo exporter turns torch.cond into an If on a run-time condition: it trains here as in PyTorch."""
    import copy

    import torch.nn.functional as F

    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

    class Gated(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda x: self.a(x).relu(), lambda x: self.b(x).tanh(), (x,))

    torch.manual_seed(0)
    model = Gated()
    reference = copy.deepcopy(model)
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((2, 4)).astype(np.float32) + (1 if i % 2 else -1), rng.integers(0, 3, 2).astype(np.int64))
        for i in range(4)
    ]  # both branches, in turn
    generate_artifacts(
        model,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.SGD,
        artifact_directory=tmp_path,
        example_inputs=(torch.from_numpy(batches[0][0]),),
        exporter="dynamo",
    )
    assert "If" in {node.op_type for node in onnx.load(tmp_path / "training_model.onnx").graph.node}
    module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.1)
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, labels in batches:
        loss = float(module(x, labels))
        optimizer.step()
        module.lazy_reset_grad()
        expected = F.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(labels))
        expected.backward()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
        assert abs(loss - expected.item()) <= 1e-5
