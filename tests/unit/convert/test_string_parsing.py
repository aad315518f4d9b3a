"""String inputs are read as onnxruntime's Cast reads them (strtoll / strtoull / strtod on the longest
numeric prefix, out-of-range values refused), not with Python's rules."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto

from ort_torch_train.convert.string_inputs import _parse
from ort_torch_train.errors import InputTypeError
from tests.helpers.ort_peer import requires_ort, run_ort

TARGETS = {"int64": TensorProto.INT64, "int32": TensorProto.INT32, "uint8": TensorProto.UINT8}
TARGETS |= {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}
ERROR = "error"
# (text, target) -> what onnxruntime 1.19.2's Cast gives (checked against it by the ort_peer test below)
EXPECTED = {
    ("1_000", "int64"): 1,
    ("1_000", "float32"): 1.0,
    ("1e400", "float64"): ERROR,
    ("1e400", "int64"): 1,
    ("1e-400", "float32"): ERROR,
    ("1e-310", "float64"): ERROR,
    ("9223372036854775808", "int64"): ERROR,
    ("-9223372036854775809", "int64"): ERROR,
    ("3000000000", "int32"): -1294967296,
    ("-1", "uint8"): 255,
    ("18446744073709551616", "uint8"): ERROR,
    (" 12abc", "int64"): 12,
    ("0x1A", "float64"): 26.0,
    ("0x1A", "int64"): 0,
    ("3.5e38", "float32"): float("inf"),
    ("INFx", "float64"): float("inf"),
    ("1e", "float64"): 1.0,
    (".5", "int64"): ERROR,
    ("abc", "float32"): ERROR,
    ("", "int64"): ERROR,
}


def _ours(text: str, target: str) -> object:
    try:
        return _parse(np.array([text], dtype=object), TARGETS[target], "text")[0].item()
    except InputTypeError:
        return ERROR


@pytest.mark.parametrize(("text", "target"), sorted(EXPECTED))
def test_strings_parse_as_onnxruntime_parses_them(text: str, target: str) -> None:
    assert _ours(text, target) == EXPECTED[text, target]


def test_an_unreadable_string_names_the_input_and_the_text() -> None:
    with pytest.raises(InputTypeError, match=r"input 'text'.*int64.*strtoll.*'9223372036854775808'"):
        _parse(np.array([["1", "9223372036854775808"]]), TensorProto.INT64, "text")


ORT_SCRIPT = """
import json, sys
import numpy as np, onnxruntime
from onnx import helper, TensorProto
cases = json.loads(sys.argv[1])
out = []
for text, target in cases:
    to = getattr(TensorProto, target)
    graph = helper.make_graph([helper.make_node("Cast", ["s"], ["y"], to=to)], "g",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [1])], [helper.make_tensor_value_info("y", to, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    try:
        out.append(session.run(None, {"s": np.array([text], dtype=object)})[0][0].item())
    except Exception:
        out.append("error")
print(json.dumps(out))
"""


@requires_ort[0]
@requires_ort[1]
def test_the_expected_values_are_onnxruntimes() -> None:
    names = {"int64": "INT64", "int32": "INT32", "uint8": "UINT8", "float32": "FLOAT", "float64": "DOUBLE"}
    cases = sorted(EXPECTED)
    got = run_ort(ORT_SCRIPT, json.dumps([[text, names[target]] for text, target in cases]))
    assert dict(zip(cases, got)) == {case: EXPECTED[case] for case in cases}
