"""The conversion's example runs hold a value's example only while a node still to convert reads it."""

from __future__ import annotations

import weakref

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from ort_torch_train.convert import graph as convert_graph_module
from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.torch_internals import TorchDispatchMode

FLOAT, BOOL = TensorProto.FLOAT, TensorProto.BOOL
ROWS, COLUMNS = 256, 1024  # 1 MiB of float32 per value
MIB = 1 << 20


class _LiveTensorBytes(TorchDispatchMode):
    """The most bytes of CPU storage that tensors made by ops run under it held at once."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref[torch.Tensor]] = []
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for made in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(made, torch.Tensor) and made.device.type == "cpu":
                self.made.append(weakref.ref(made))
        alive = [tensor for tensor in (ref() for ref in self.made) if tensor is not None]
        self.made = [weakref.ref(tensor) for tensor in alive]
        storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes() for tensor in alive}
        self.peak = max(self.peak, sum(storages.values()))
        return result


def _info(name: str, elem: int, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _convert(model: onnx.ModelProto, examples: list[torch.Tensor]) -> torch.fx.GraphModule:
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in examples]
    opsets = {o.domain: o.version for o in model.opset_import}
    return convert_graph(model.graph, opsets, specs, training=True, examples=examples)


def _chain_model(length: int) -> onnx.ModelProto:
    """``h_i = Sin(h_{i-1}) + x``, ``length`` times; the output also reads ``h_1`` (a long-lived value)."""
    nodes, previous = [], "x"
    for i in range(1, length + 1):
        nodes.append(helper.make_node("Sin", [previous], [f"s{i}"]))
        nodes.append(helper.make_node("Add", [f"s{i}", "x"], [f"h{i}"]))
        previous = f"h{i}"
    nodes.append(helper.make_node("Add", [previous, "h1"], ["y"]))
    graph = helper.make_graph(
        nodes, "chain", [_info("x", FLOAT, [ROWS, COLUMNS])], [_info("y", FLOAT, [ROWS, COLUMNS])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_intermediate_examples_are_released_as_soon_as_nothing_reads_them():
    model = _chain_model(24)  # 48 intermediate values of 1 MiB
    x = torch.randn(ROWS, COLUMNS)
    with _LiveTensorBytes() as live:
        module = _convert(model, [x])
    # at most the value being made, its input, h1 and the output: the old conversion held all 48 MiB
    assert live.peak <= 5 * MIB, f"{live.peak / MIB:.1f} MiB of example values held at once"
    assert all(made() is None for made in live.made)  # nothing of the example runs outlives the conversion
    vals = [node.meta.get("val") for node in module.graph.nodes]
    assert all(val is None or val.device.type == "meta" for val in vals)  # shapes only, no example data kept
    (y,) = module(x)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x.numpy()})
    torch.testing.assert_close(y, torch.from_numpy(expected))


def test_values_read_only_by_subgraphs_and_inlined_branches_stay_until_read():
    """``w`` is read only inside a Loop body, ``v`` only inside run-time If branches, ``u`` only by an
    inlined constant If (whose branch output is the graph's output), each long after it was made."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "w"], ["acc_out"]), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [_info("i", TensorProto.INT64, []), _info("cond", BOOL, []), _info("acc", FLOAT, [2, 3])],
        [_info("cond_out", BOOL, []), _info("acc_out", FLOAT, [2, 3])],
    )
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["v", "v"], ["t"])], "then", [], [_info("t", FLOAT, [2, 3])]
    )
    else_branch = helper.make_graph([helper.make_node("Neg", ["v"], ["e"])], "else", [], [_info("e", FLOAT, [2, 3])])
    inlined = helper.make_graph(
        [helper.make_node("Add", ["u", "after_if"], ["z"])], "inlined", [], [_info("z", FLOAT, [2, 3])]
    )
    unused = helper.make_graph([helper.make_node("Identity", ["u"], ["o"])], "unused", [], [_info("o", FLOAT, [2, 3])])
    nodes = [
        helper.make_node("Sin", ["x"], ["w"]),
        helper.make_node("Cos", ["x"], ["v"]),
        helper.make_node("Exp", ["x"], ["u"]),
        helper.make_node("Loop", ["trips", "", "x"], ["after_loop"], body=body),
        helper.make_node("If", ["c"], ["after_if"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Add", ["after_loop", "after_if"], ["sum"]),
        helper.make_node("If", ["true"], ["y"], then_branch=inlined, else_branch=unused),
    ]
    initializers = [
        onnx.numpy_helper.from_array(np.array(3, dtype=np.int64), "trips"),
        onnx.numpy_helper.from_array(np.array(True), "true"),
    ]
    graph = helper.make_graph(
        nodes,
        "scopes",
        [_info("x", FLOAT, [2, 3]), _info("c", BOOL, [])],
        [_info("y", FLOAT, [2, 3]), _info("sum", FLOAT, [2, 3])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = torch.randn(2, 3)
    module = _convert(model, [x, torch.tensor(True)])
    for condition in (True, False):
        y, total = module(x, torch.tensor(condition))
        after_if = torch.cos(x) ** 2 if condition else -torch.cos(x)
        torch.testing.assert_close(y, torch.exp(x) + after_if)
        torch.testing.assert_close(total, x + 3 * torch.sin(x) + after_if)


def test_a_weight_sized_constant_is_bound_not_serialized_for_its_converter(monkeypatch):
    """A lifted constant (``lift_initializers``) reaches the converted module as the tensor given, and its
    converter reads it at run time: no serialized copy of the weight is made for the converter."""
    weight = torch.randn(COLUMNS, 512)  # 2 MiB of float32
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Gather", ["w", "i"], ["rows"])]
    graph = helper.make_graph(
        nodes,
        "weight",
        [_info("x", FLOAT, [2, COLUMNS]), _info("i", TensorProto.INT64, [3])],
        [_info("y", FLOAT, [2, 512]), _info("rows", FLOAT, [3, 512])],
    )
    serialized: list[str] = []
    real = convert_graph_module.tensor_to_proto
    monkeypatch.setattr(
        convert_graph_module, "tensor_to_proto", lambda t, name: serialized.append(name) or real(t, name)
    )
    x, i = torch.randn(2, COLUMNS), torch.tensor([0, 5, COLUMNS - 1])
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (x, i)]
    module = convert_graph(graph, {"": 17}, specs, training=True, examples=[x, i], constants={"w": weight})
    assert "w" not in serialized
    assert weight.untyped_storage().data_ptr() in {b.untyped_storage().data_ptr() for b in module.buffers()}
    y, rows = module(x, i)
    torch.testing.assert_close(y, x @ weight)
    torch.testing.assert_close(rows, weight[i])
