"""Models in ONNX Runtime's own format (.ort, FlatBuffers) are read from a path and from bytes, for the training,
eval and optimizer models: the committed ones made by onnxruntime-training 1.19.2's converter and one saved by the
installed onnxruntime. A damaged or truncated one is refused naming the file, never a crash; a file in neither
format says which formats were tried."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ort_torch_train.errors import ModelError, OrtFormatModelError
from ort_torch_train.graph.layout import load_model, opsets_of
from ort_torch_train.optim.optimizer_model import read_optimizer_model
from tests.helpers.ort_format import save_in_ort_format
from tests.helpers.paths import FIXTURES

ONNX_ARTIFACTS = FIXTURES / "mlp_ce_adamw_sched" / "artifacts"
ORT_ARTIFACTS = FIXTURES / "mlp_ce_adamw_sched" / "artifacts_ort"
DAMAGED = r"is a damaged or unreadable ORT-format model \(\.ort\): ORT model verification failed\."


def io_signature(model: onnx.ModelProto) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    return list(model.graph.input), list(model.graph.output)


@pytest.mark.parametrize("name", ["training_model", "eval_model"])
def test_an_ort_format_model_holds_what_the_onnx_model_holds(name: str) -> None:
    path = ORT_ARTIFACTS / f"{name}.ort"
    from_path, from_bytes = load_model(path, name), load_model(path.read_bytes(), name)
    original = load_model(ONNX_ARTIFACTS / f"{name}.onnx", name)
    assert from_path == from_bytes
    assert io_signature(from_path) == io_signature(original)  # names, element types, shapes (dim_param "batch")
    assert opsets_of(original).items() <= opsets_of(from_path).items()  # ORT adds the domains it knows
    onnx.checker.check_model(from_path)
    made: set[str] = {value.name for value in from_path.graph.input} | {t.name for t in from_path.graph.initializer}
    for node in from_path.graph.node:  # ORT saves nodes by index, which its fusions leave out of order
        assert {value for value in node.input if value} <= made, node.op_type
        made.update(node.output)
    original_values = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    for tensor in from_path.graph.initializer:
        if tensor.name in original_values:
            np.testing.assert_array_equal(numpy_helper.to_array(tensor), original_values[tensor.name])
    assert "FusedGemm" in {node.op_type for node in from_path.graph.node}  # what ORT's optimizers made of Gemm+Relu


def test_an_ort_format_optimizer_model_reads_as_its_onnx_model() -> None:
    path = ORT_ARTIFACTS / "optimizer_model.ort"
    expected = read_optimizer_model(ONNX_ARTIFACTS / "optimizer_model.onnx")
    assert read_optimizer_model(path) == expected
    assert read_optimizer_model(path.read_bytes()) == expected


def test_a_model_saved_in_ort_format_by_the_installed_onnxruntime_reads(tmp_path: Path) -> None:
    saved = save_in_ort_format(ONNX_ARTIFACTS / "eval_model.onnx", tmp_path / "eval_model.ort")
    model = load_model(saved, "eval model")
    assert [value.name for value in model.graph.input] == [
        "input",
        "labels",
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]
    onnx.checker.check_model(model)


def test_a_truncated_ort_format_model_is_refused_naming_the_file(tmp_path: Path) -> None:
    data = (ORT_ARTIFACTS / "training_model.ort").read_bytes()
    for cut in (8, 12, 64, len(data) // 2, len(data) - 4):
        path = tmp_path / f"cut_{cut}.ort"
        path.write_bytes(data[:cut])
        with pytest.raises(OrtFormatModelError, match=f"^training model {re.escape(repr(str(path)))} {DAMAGED}"):
            load_model(path, "training model")
        with pytest.raises(OrtFormatModelError, match=f"^training model {DAMAGED}"):
            load_model(data[:cut], "training model")
        with pytest.raises(OrtFormatModelError, match=f"^optimizer model {re.escape(repr(str(path)))} {DAMAGED}"):
            read_optimizer_model(path)


def test_a_corrupted_ort_format_model_is_read_or_refused_never_a_crash() -> None:
    """Random bytes overwritten anywhere: the model reads (a value changed) or a ModelError says what is wrong."""
    data = (ORT_ARTIFACTS / "training_model.ort").read_bytes()
    rng = random.Random(52)
    refused = 0
    for _ in range(200):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 2, 4))):
            damaged[rng.randrange(8, len(damaged))] = rng.randrange(256)
        try:
            load_model(bytes(damaged), "training model")
        except ModelError as error:
            assert str(error).startswith("training model "), error
            refused += 1
    assert refused > 100  # most damage is found: offsets, lengths, vtables and strings are all checked


def test_a_file_in_neither_format_names_both(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x18\x00\x00\x00ORTX" + bytes(range(64)))
    noise = tmp_path / "noise.ort"
    noise.write_bytes(np.random.default_rng(52).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    for path in (garbage, noise):
        with pytest.raises(ModelError, match="not a readable ONNX model .*nor an ORT-format model"):
            load_model(path, "training model")
        with pytest.raises(ModelError, match="nor an ORT-format model"):
            read_optimizer_model(path.read_bytes())


def test_subgraphs_and_attributes_read_back_as_onnxruntime_saved_them(tmp_path: Path) -> None:
    """An If whose branches read an outer-scope value, float, int and ints attributes, a constant: saved in ORT
    format by the installed onnxruntime (optimizations off), read back, and run by onnx's reference evaluator."""
    ort = pytest.importorskip("onnxruntime")
    h = onnx.helper
    branch = {
        name: h.make_graph(
            [h.make_node(op, ["scaled"], [f"{name}_out"], **attrs)],
            name,
            [],
            [h.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, ["batch", 3])],
        )
        for name, op, attrs in (("then", "LeakyRelu", {"alpha": 0.25}), ("else", "Neg", {}))
    }
    nodes = [
        h.make_node("Mul", ["x", "scale"], ["scaled"]),
        h.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        h.make_node("Greater", ["total", "zero"], ["positive"]),
        h.make_node("If", ["positive"], ["chosen"], then_branch=branch["then"], else_branch=branch["else"]),
        h.make_node("Transpose", ["chosen"], ["y"], perm=[1, 0]),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, "batch"])],
        [
            numpy_helper.from_array(np.float32([1.5, -2.0, 0.5]), "scale"),
            numpy_helper.from_array(np.float32(0), "zero"),
        ],
    )
    source = tmp_path / "if.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), source)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "if.ort")
    options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    model = load_model(tmp_path / "if.ort", "model")
    assert [value.name for value in model.graph.output] == ["y"]
    assert model.graph.output[0] == onnx.load(source).graph.output[0]
    [if_node] = [node for node in model.graph.node if node.op_type == "If"]
    assert [attribute.g.node[0].op_type for attribute in if_node.attribute] == ["LeakyRelu", "Neg"]
    run = ReferenceEvaluator(model)
    for x in (np.float32([[1, 2, 3], [4, 5, -6]]), np.float32([[-1, -2, 3], [-4, 5, -6]])):
        expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(run.run(None, {"x": x})[0], expected)
