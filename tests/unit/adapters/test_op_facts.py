"""Operator facts given to ``register``/``declare``: a random op is never folded, a shape read from a computed
input stays dynamic, conflicting facts raise, and every fact of the former ``op_traits`` tables is in place."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import ort_torch_train.convert.graph  # noqa: F401  (declares the control-flow ops' facts)
from ort_torch_train.adapters import OpFacts, declare, find_converter, op_facts, register
from ort_torch_train.adapters.common import Inline, result
from ort_torch_train.adapters.registry import _FACTS, _REGISTRY
from ort_torch_train.convert.graph import TensorSpec, convert_graph

TEST = "com.example.test"
OPSETS = {"": 18, TEST: 1}

# The tables of ort_torch_train/convert/op_traits.py before the facts moved onto the converters.
RANDOM = {
    ("", "Dropout"),
    ("", "RandomNormal"),
    ("", "RandomNormalLike"),
    ("", "RandomUniform"),
    ("", "RandomUniformLike"),
    ("", "Bernoulli"),
    ("", "Multinomial"),
    ("com.microsoft", "BitmaskDropout"),
    ("com.microsoft", "BiasDropout"),
    ("com.microsoft", "BitmaskBiasDropout"),
}
DATA_DEPENDENT = {"NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit"}
CONTROL_FLOW = {"Loop", "If", "Scan"}  # were data-dependent too: control flow implies it
SHAPE_VALUE_INPUTS = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Range": (0, 1, 2),
    "ConstantOfShape": (0,),
    "OneHot": (1,),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "CenterCropPad": (1,),
    "Col2Im": (1, 2),
    "AffineGrid": (1,),
    "DFT": (1, 2),
    "STFT": (1, 3),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1),
    "MaxUnpool": (2,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceL1": (1,),
    "ReduceL2": (1,),
    "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
}
WRITTEN_INPUTS = {("", "BatchNormalization"): (3, 4), ("com.microsoft", "BatchNormInternal"): (3, 4)}
QUANTIZED_INPUTS = {("com.microsoft", "MatMulNBits"): (1, 3), ("com.microsoft", "GatherBlockQuantized"): (0, 3)}


@pytest.fixture
def test_domain() -> Iterator[str]:
    """The domain of this file's ops; what a test registers there is removed after it."""
    yield TEST
    for table in (_REGISTRY, _FACTS):
        for key in [key for key in table if key[0] == TEST]:
            del table[key]


def noise(x: torch.Tensor) -> torch.Tensor:
    return x + torch.randn_like(x)


def reshape_to(x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    return x.reshape(shape.tolist())


def _convert_inline(function):
    def convert(node, graph, context):
        return result(Inline(function), node)

    return convert


def test_the_former_tables_facts_are_all_on_the_registrations_and_nothing_else() -> None:
    expected: dict[tuple[str, str], OpFacts] = {key: OpFacts(random=True) for key in RANDOM}
    expected |= {("", op_type): OpFacts(data_dependent_shape=True) for op_type in DATA_DEPENDENT}
    expected |= {("", op_type): OpFacts(control_flow=True) for op_type in CONTROL_FLOW}
    expected |= {("", op_type): OpFacts(shape_inputs=positions) for op_type, positions in SHAPE_VALUE_INPUTS.items()}
    expected |= {key: OpFacts(writes_inputs=positions) for key, positions in WRITTEN_INPUTS.items()}
    expected |= {key: OpFacts(quantized_inputs=positions) for key, positions in QUANTIZED_INPUTS.items()}
    assert len(expected) == len(RANDOM) + len(DATA_DEPENDENT | CONTROL_FLOW) + len(SHAPE_VALUE_INPUTS) + 4

    for (domain, op_type), facts in expected.items():
        assert op_facts(domain, op_type) == facts, f"{domain or 'ai.onnx'}::{op_type}"
    stated = {key: facts for key, facts in _FACTS.items() if facts != OpFacts() and not key[0].startswith("com.ex")}
    assert stated == expected


def test_an_unknown_op_and_the_spelled_out_default_domain() -> None:
    assert op_facts("", "NoSuchOp") == OpFacts()
    assert op_facts("ai.onnx", "Reshape") == op_facts("", "Reshape") == OpFacts(shape_inputs=(1,))
    assert op_facts("com.microsoft", "Reshape") == OpFacts()  # the default domain's facts only


def _constant_input_graph(op_type: str) -> helper.GraphProto:
    node = helper.make_node(op_type, ["c"], ["y"], domain=TEST)
    constant = numpy_helper.from_array(np.zeros(16, np.float32), "c")
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])
    return helper.make_graph([node], "g", [], [output], initializer=[constant])


@pytest.mark.parametrize("random", [True, False])
def test_a_random_op_on_constant_inputs_is_not_folded(test_domain: str, random: bool) -> None:
    register("Noise", domain=test_domain, random=random)(_convert_inline(noise))
    module = convert_graph(_constant_input_graph("Noise"), OPSETS, [], training=True)
    (first,), (second,) = module(), module()
    kept = [node for node in module.graph.nodes if node.op == "call_function" and node.target is noise]
    assert (len(kept), torch.equal(first, second)) == ((1, False) if random else (0, True))


def _reshape_then_shape_graph(op_type: str) -> helper.GraphProto:
    nodes = [helper.make_node(op_type, ["x", "s"], ["y"], domain=TEST), helper.make_node("Shape", ["y"], ["shape"])]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
    ]
    return helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])])


@pytest.mark.parametrize("shape_inputs", [(1,), ()])
def test_a_shape_read_from_a_graph_input_stays_dynamic(test_domain: str, shape_inputs: tuple[int, ...]) -> None:
    register("ReshapeTo", domain=test_domain, shape_inputs=shape_inputs)(_convert_inline(reshape_to))
    specs = [TensorSpec((2, 3), torch.float32), TensorSpec((2,), torch.int64)]
    x, example_shape = torch.zeros(2, 3), torch.tensor([3, 2])
    module = convert_graph(
        _reshape_then_shape_graph("ReshapeTo"), OPSETS, specs, training=True, examples=[x, example_shape]
    )
    (shape,) = module(x, torch.tensor([6, 1]))
    assert shape.tolist() == ([6, 1] if shape_inputs else [3, 2])  # unmarked: frozen at the example's shape


def test_conflicting_facts_for_one_op_raise(test_domain: str) -> None:
    register("Versioned", domain=test_domain, since=1, shape_inputs=(1,))(_convert_inline(reshape_to))
    register("Versioned", domain=test_domain, since=5, shape_inputs=(1,))(_convert_inline(reshape_to))
    with pytest.raises(
        ValueError, match=r"com\.example\.test::Versioned conflict.*shape_inputs=\(1,\).*shape_inputs=\(\)"
    ):
        register("Versioned", domain=test_domain, since=9)(_convert_inline(reshape_to))
    with pytest.raises(ValueError, match="Versioned conflict"):
        declare("Versioned", domain=test_domain, random=True)
    assert [since for since, _ in _REGISTRY[(test_domain, "Versioned")]] == [5, 1]  # the refused one not added
    assert op_facts(test_domain, "Versioned") == OpFacts(shape_inputs=(1,))


def test_a_converter_registered_under_the_ai_onnx_spelling_is_found_under_both() -> None:
    op_type = "OrtTorchTrainTestOnly"
    converter = _convert_inline(noise)
    try:
        register(op_type, domain="ai.onnx", random=True)(converter)
        assert find_converter("", op_type, 18) is converter and find_converter("ai.onnx", op_type, 18) is converter
        assert op_facts("", op_type).random and op_facts("ai.onnx", op_type).random
    finally:
        for table in (_REGISTRY, _FACTS):
            table.pop(("", op_type), None)
