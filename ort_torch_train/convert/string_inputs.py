"""String graph inputs read only by a Cast to a number: parsed on the host before the graph, as ORT's Cast does.

torch has no string tensors. A string input whose every reader is ``Cast(to=T)`` (one numeric ``T``)
becomes a ``T`` input; the caller's string array is parsed into ``T`` before the step, and the Cast,
now from ``T`` to ``T``, is a no-op. Strings are read as onnxruntime reads them: C's ``strtoll`` /
``strtoull`` / ``strtod`` on the longest numeric prefix ("12abc" is 12, "1_000" is 1), values out of
the wide type's range refused, then cast to ``T`` (integers wrap, doubles past float32 become inf).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from ort_torch_train.convert.subgraphs import names_read, subgraphs
from ort_torch_train.errors import InputTypeError, UnsupportedOperatorError

STRING, BOOL = onnx.TensorProto.STRING, onnx.TensorProto.BOOL


def numeric_inputs(graph: onnx.GraphProto) -> tuple[onnx.GraphProto, dict[str, int]]:
    """``graph`` with its string inputs retyped to their Cast's target, and ``{input name: target elem type}``."""
    casts: dict[str, int] = {}
    for value in graph.input:
        if value.type.tensor_type.elem_type == STRING:
            casts[value.name] = _cast_target(graph, value.name)
    if not casts:
        return graph, casts
    retyped = onnx.GraphProto()
    retyped.CopyFrom(graph)
    for value in retyped.input:
        if value.name in casts:
            value.type.tensor_type.elem_type = casts[value.name]
    return retyped, casts


def _cast_target(graph: onnx.GraphProto, name: str) -> int:
    targets = set()
    for node in graph.node:
        nested = any(name in names_read(subgraph) for subgraph in subgraphs(node))
        if name not in node.input and not nested:
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or nested or to in (None, STRING, BOOL):
            raise UnsupportedOperatorError(
                f"string input {name!r} is read by {node.op_type} node {node.name!r}: torch has no string tensors; "
                "a string input is supported when only Cast nodes to a (non-bool) number read it"
            )
        targets.add(to)
    if name in {output.name for output in graph.output} or len(targets) != 1:
        raise UnsupportedOperatorError(
            f"string input {name!r} must be read by Cast nodes to one numeric type only "
            f"(found targets {sorted(onnx.TensorProto.DataType.Name(t) for t in targets)}, or it is a graph output)"
        )
    return targets.pop()


def parse_string_inputs(values: Sequence[Any], names: Sequence[str], casts: Mapping[str, int]) -> list[Any]:
    """``values`` with the string arrays of the inputs in ``casts`` parsed into their numeric type."""
    if not casts:
        return list(values)
    parsed = list(values)
    for position, (value, name) in enumerate(zip(values, names)):
        if name in casts and isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
            parsed[position] = _parse(value, casts[name], name)
    return parsed


def _parse(array: np.ndarray, elem_type: int, name: str) -> np.ndarray:
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    read: Callable[[str], float | None]
    wide: np.dtype
    if np.issubdtype(dtype, np.unsignedinteger):
        read, wide = _unsigned, np.dtype(np.uint64)
    elif np.issubdtype(dtype, np.integer):
        read, wide = _signed, np.dtype(np.int64)
    else:
        read, wide = _real, np.dtype(np.float64)
    values = []
    for item in array.reshape(-1):
        text = _text(item)
        value = read(text)
        if value is None:
            raise InputTypeError(
                f"input {name!r}: strings that Cast to {dtype.name} expected, as onnxruntime reads them "
                f"(a number at the start, C's {read.__doc__}); got {text!r}"
            )
        values.append(value)
    with np.errstate(over="ignore"):  # a double past float32's range becomes inf, as in ORT's cast
        return np.array(values, dtype=wide).astype(dtype).reshape(array.shape)


_SPACE = "[ \t\n\v\f\r]*"
_INTEGER = re.compile(_SPACE + "([+-]?)([0-9]+)")
_REAL = re.compile(
    _SPACE
    + "(?:(?P<hex>[+-]?0[xX](?:[0-9a-fA-F]+\\.?[0-9a-fA-F]*|\\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?)"
    + "|(?P<decimal>[+-]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
    + "|(?P<special>[+-]?(?:inf(?:inity)?|nan(?:\\([0-9A-Za-z_]*\\))?)))",
    re.IGNORECASE,
)
_SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)


def _signed(text: str) -> int | None:
    """strtoll: the longest integer prefix, in int64's range"""
    match = _INTEGER.match(text)
    if match is None:
        return None
    value = int(match.group(1) + match.group(2))
    return value if -(2**63) <= value < 2**63 else None


def _unsigned(text: str) -> int | None:
    """strtoull: the longest integer prefix, below 2**64, a minus sign negating modulo 2**64"""
    match = _INTEGER.match(text)
    if match is None or int(match.group(2)) >= 2**64:
        return None
    value = int(match.group(2))
    return (-value) % 2**64 if match.group(1) == "-" else value


def _real(text: str) -> float | None:
    """strtod: the longest decimal, hexadecimal, inf or nan prefix, within double's normal range"""
    match = _REAL.match(text)
    if match is None:
        return None
    if match.group("special"):
        return float(match.group("special").split("(")[0])
    try:
        value = float.fromhex(match.group("hex")) if match.group("hex") else float(match.group("decimal"))
    except OverflowError:
        return None
    digits = re.sub(
        "[^1-9a-fA-F]",
        "",
        re.split("[eEpP]", match.group("hex") or match.group("decimal"))[0][2 if match.group("hex") else 0 :],
    )
    if math.isinf(value) or (abs(value) < _SMALLEST_NORMAL and digits):  # std::stod's out_of_range
        return None
    return value


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
