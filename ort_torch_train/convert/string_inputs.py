"""String graph inputs read only by a Cast to a number: parsed on the host before the graph, as ORT's Cast does.

torch has no string tensors. A string input whose every reader is ``Cast(to=T)`` (one numeric ``T``)
becomes a ``T`` input; the caller's string array is parsed into ``T`` before the step, and the Cast,
now from ``T`` to ``T``, is a no-op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    text = np.char.strip(np.vectorize(_text, otypes=[str])(array)) if array.size else array.astype(str)
    try:
        if np.issubdtype(dtype, np.integer):
            return text.astype(np.int64).astype(dtype)
        return text.astype(np.float64).astype(dtype)
    except ValueError as error:
        raise InputTypeError(f"input {name!r}: strings that Cast to {np.dtype(dtype).name} expected; {error}") from None


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
