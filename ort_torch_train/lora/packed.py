"""Per-projection LoRA targets on a packed ``qkv_proj`` weight: ``a.q_proj.MatMul.weight`` names the q
columns of ``a.qkv_proj.MatMul.weight`` (or its MatMulNBits ``..._Q4``), sized by the GroupQueryAttention
that reads the product."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import onnx

from ort_torch_train.errors import ModelError
from ort_torch_train.lora.uses import QUANTIZED_SUFFIX, WeightUse, attribute, consumers_of, linear_uses

PACKED_QKV = "qkv_proj"
PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def projection_names(weight: str) -> dict[str, int]:
    """``{projection target name: index in (q, k, v)}`` for a packed ``qkv_proj`` weight, else empty:
    ``a.qkv_proj.MatMul.weight_Q4`` -> ``a.q_proj.MatMul.weight``, ``a.k_proj...``, ``a.v_proj...``."""
    plain = QUANTIZED_SUFFIX.sub("", weight)
    if plain.count(PACKED_QKV) != 1:
        return {}
    return {plain.replace(PACKED_QKV, projection): index for index, projection in enumerate(PROJECTIONS)}


def projection_uses(
    graph: onnx.GraphProto,
    weight: str,
    projection: str,
    consumers: Mapping[str, list[tuple[onnx.NodeProto, int]]] | None = None,
) -> list[WeightUse]:
    """The uses of packed ``weight`` restricted to ``projection``'s output columns, sized by the
    GroupQueryAttention that reads the product (its num_heads and kv_num_heads)."""
    consumers = consumers_of(graph) if consumers is None else consumers
    uses, others = linear_uses(weight, consumers)
    if others or not uses:
        raise ModelError(
            f"LoRA target {projection!r}: the packed weight {weight!r} is not used only as a weight matrix"
        )
    index = projection_names(weight)[projection]
    found = []
    for use in uses:
        heads = _attention_heads(use.node.output[0], consumers)
        if heads is None:
            raise ModelError(
                f"LoRA target {projection!r}: no GroupQueryAttention reads the product of the packed weight {weight!r}, "
                "so its q/k/v columns are unknown; target the packed weight itself"
            )
        total = _output_size(graph, weight, use)
        size = total // (heads[0] + 2 * heads[1])
        if size == 0 or size * (heads[0] + 2 * heads[1]) != total:
            raise ModelError(
                f"LoRA target {projection!r}: the packed weight {weight!r} has {total} outputs, not a multiple of "
                f"num_heads + 2 * kv_num_heads = {heads[0] + 2 * heads[1]}"
            )
        sizes = (heads[0] * size, heads[1] * size, heads[1] * size)
        found.append(dataclasses.replace(use, weight=weight, columns=(sum(sizes[:index]), sizes[index])))
    return found


def _attention_heads(value: str, consumers: Mapping[str, list[tuple[onnx.NodeProto, int]]]) -> tuple[int, int] | None:
    """(num_heads, kv_num_heads) of the GroupQueryAttention reading ``value`` as its packed query (through a
    bias Add), or None."""
    for node, index in consumers.get(value, []):
        if node.op_type == "Add" and node.domain in ("", "ai.onnx"):
            found = _attention_heads(node.output[0], consumers)
            if found is not None:
                return found
        if node.op_type == "GroupQueryAttention" and index == 0:
            return int(attribute(node, "num_heads", 0)), int(attribute(node, "kv_num_heads", 0))  # type: ignore[call-overload]
    return None


def _output_size(graph: onnx.GraphProto, weight: str, use: WeightUse) -> int:
    """The product's output features: a MatMulNBits node's N, else the weight's declared out dimension."""
    if use.node.op_type == "MatMulNBits":
        return int(attribute(use.node, "N", 0))  # type: ignore[call-overload]
    for init in graph.initializer:
        if init.name == weight:
            return int(init.dims[0 if use.transposed else 1])
    for value in graph.input:
        if value.name == weight:
            dims = value.type.tensor_type.shape.dim
            return int(dims[0 if use.transposed else 1].dim_value)
    return 0


def packed_weight(graph: onnx.GraphProto, projection: str) -> str | None:
    """The packed qkv weight of the graph that ``projection`` names a projection of, or None."""
    if not any(p in projection for p in PROJECTIONS):
        return None
    names = {value.name for value in (*graph.initializer, *graph.input)}
    if projection in names:
        return None
    for name in names:
        if projection in projection_names(name):
            return name
    return None


def target_weight(name: str, uses: Sequence[WeightUse]) -> str:
    """The weight parameter behind target ``name`` (a packed weight for a projection target)."""
    return uses[0].weight or name
