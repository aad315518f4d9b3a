"""Where a graph multiplies by a weight matrix: MatMul/Gemm input 1 (directly or through a 2-D Transpose)
and the packed weight of com.microsoft MatMulNBits (logical shape (N, K), stored (out, in))."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import onnx

MICROSOFT = "com.microsoft"
QUANTIZED_SUFFIX = re.compile(r"_Q\d+$")  # the builder's packed weights: <name>.MatMul.weight_Q4


@dataclass(frozen=True)
class WeightUse:
    """A MatMul/Gemm multiplying ``x`` by a weight (directly or through a Transpose); for a projection of a
    packed ``qkv_proj`` weight, the weight's name and the projection's output columns ``(offset, size)``."""

    node: onnx.NodeProto
    x: str
    transposed: bool  # the weight is stored (out, in)
    gemm_alpha: float
    weight: str = ""  # the packed weight, for a projection target (named after the projection)
    columns: tuple[int, int] | None = None


def quantized_weights(graph: onnx.GraphProto) -> dict[str, tuple[list[int], str]]:
    """The packed weights of the graph's MatMulNBits nodes: their logical ``[N, K]`` shape and scales' name."""
    found = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits" and node.domain == MICROSOFT and len(node.input) > 2:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            found[node.input[1]] = ([int(attrs["N"]), int(attrs["K"])], node.input[2])
    return found


def quantization_parameters(graph: onnx.GraphProto) -> set[str]:
    """The scales, zero points, g_idx and bias of the graph's MatMulNBits nodes: never LoRA targets."""
    return {
        name
        for node in graph.node
        if node.op_type == "MatMulNBits" and node.domain == MICROSOFT
        for name in node.input[2:]
        if name
    }


def consumers_of(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    found: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for index, value in enumerate(node.input):
            found[value].append((node, index))
    return found


def linear_uses(
    weight: str, consumers: Mapping[str, list[tuple[onnx.NodeProto, int]]]
) -> tuple[list[WeightUse], list[str]]:
    """The MatMul/Gemm uses of ``weight`` and descriptions of every other use. A packed weight's embedding
    lookups (GatherBlockQuantized, directly or through a Reshape: a tied, quantised embedding) are neither:
    an adapter changes the products only, as PEFT's on a tied LM head."""
    uses: list[WeightUse] = []
    others: list[str] = []
    for node, index in consumers.get(weight, []):
        if _quantized_lookup(node, index, consumers):
            continue
        if node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and attribute(node, "perm", [1, 0]) == [1, 0]:
            for inner, inner_index in consumers.get(node.output[0], []):
                use = _matrix_use(inner, inner_index, flipped=True)
                uses.append(use) if use else others.append(f"{inner.op_type} input {inner_index} (after a Transpose)")
            continue
        use = _matrix_use(node, index, flipped=False)
        uses.append(use) if use else others.append(f"{node.op_type} input {index}")
    return uses, others


def _quantized_lookup(
    node: onnx.NodeProto, index: int, consumers: Mapping[str, list[tuple[onnx.NodeProto, int]]]
) -> bool:
    """Whether input ``index`` of ``node`` is the table of a GatherBlockQuantized, directly or through a Reshape."""
    if node.op_type == "GatherBlockQuantized" and node.domain == MICROSOFT:
        return index == 0
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or index != 0:
        return False
    readers = consumers.get(node.output[0], [])
    return bool(readers) and all(
        reader.op_type == "GatherBlockQuantized" and reader.domain == MICROSOFT and position == 0
        for reader, position in readers
    )


def _matrix_use(node: onnx.NodeProto, index: int, flipped: bool) -> WeightUse | None:
    if node.op_type == "MatMulNBits" and node.domain == MICROSOFT and index == 1 and not flipped:
        return WeightUse(node, node.input[0], True, 1.0)  # packed (N, K): stored (out, in)
    if node.domain not in ("", "ai.onnx") or index != 1:
        return None
    if node.op_type == "MatMul":
        return WeightUse(node, node.input[0], flipped, 1.0)
    if node.op_type == "Gemm" and attribute(node, "transA", 0) == 0:
        transposed = bool(attribute(node, "transB", 0)) != flipped
        return WeightUse(node, node.input[0], transposed, _floatattribute(node, "alpha", 1.0))
    return None


def attribute(node: onnx.NodeProto, name: str, default: object) -> object:
    for attribute in node.attribute:
        if attribute.name == name:
            value = onnx.helper.get_attribute_value(attribute)
            return list(value) if isinstance(value, (list, tuple)) else value
    return default


def _floatattribute(node: onnx.NodeProto, name: str, default: float) -> float:
    value = attribute(node, name, default)
    return float(value) if isinstance(value, (int, float)) else default
