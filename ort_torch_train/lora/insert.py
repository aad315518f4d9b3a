"""The graph rewrite: low-rank adapter branches beside the MatMul/Gemm nodes that read a target weight.

``y = x @ W_eff`` becomes ``y = x @ W_eff + scaling * (x @ A) @ B`` (A: in x r, B: r x out), the
branch inserted right after the base node; the base node keeps its name and gets a new output.
Weights are found as inputs 1 of MatMul/Gemm, directly or through a 2-D Transpose, and as the packed
weights (input 1) of com.microsoft MatMulNBits, whose logical shape is (N, K), stored (out, in).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence

import onnx
import torch

from ort_torch_train.errors import ModelError
from ort_torch_train.lora.config import ALL_LINEAR, LoraConfig
from ort_torch_train.lora.packed import packed_weight, projection_names, projection_uses, target_weight
from ort_torch_train.lora.record import LoraRecord, LoraTarget, LoraUse
from ort_torch_train.lora.uses import (
    QUANTIZED_SUFFIX,
    WeightUse,
    consumers_of,
    linear_uses,
)

OUTPUT_LAYER_MARK = "lm_head"


def adapter_names(weight: str) -> tuple[str, str]:
    """The (A, B) tensor names for ``weight``, following onnxruntime-genai's builder where its names are used.

    ``model.layers.0.attn.q_proj.MatMul.weight`` -> ``model.layers.0.attn.q_proj.lora_A.MatMul.weight``;
    ``h.0.attn.c_attn.weight`` -> ``h.0.attn.c_attn.lora_A.weight``; any other name gets ``_lora_A``.
    A MatMulNBits weight ``...MatMul.weight_Q4`` is named as its float weight ``...MatMul.weight``.
    """
    weight = QUANTIZED_SUFFIX.sub("", weight)
    if weight.endswith(".MatMul.weight"):
        stem = weight[: -len(".MatMul.weight")]
        return f"{stem}.lora_A.MatMul.weight", f"{stem}.lora_B.MatMul.weight"
    if weight.endswith(".weight"):
        stem = weight[: -len(".weight")]
        return f"{stem}.lora_A.weight", f"{stem}.lora_B.weight"
    return f"{weight}_lora_A", f"{weight}_lora_B"


def select_targets(
    graph: onnx.GraphProto, shapes: Mapping[str, Sequence[int]], config: LoraConfig
) -> dict[str, list[WeightUse]]:
    """The targeted weights (in ``shapes``' order) with their MatMul/Gemm uses; raises naming a bad target."""
    consumers = consumers_of(graph)
    chosen: dict[str, list[WeightUse]] = {}
    for pattern in config.targets:
        if pattern == ALL_LINEAR:
            for name, shape in shapes.items():
                uses, others = linear_uses(name, consumers)
                if len(shape) == 2 and uses and not others and OUTPUT_LAYER_MARK not in name:
                    chosen.setdefault(name, uses)
            if not chosen:
                raise ModelError(
                    "LoRA targets 'all-linear': no parameter is used only as a MatMul/Gemm/MatMulNBits weight matrix"
                )
            continue

        # a pattern matching a projection name of a packed qkv_proj tensor means the projection ('*v_proj*'
        # also matches 'qkv_proj' itself): packed weights get per-projection targets, their scales none
        matched = [
            name
            for name in shapes
            if fnmatch.fnmatchcase(name, pattern)
            and not any(fnmatch.fnmatchcase(projection, pattern) for projection in projection_names(name))
        ]
        projections = {
            projection: weight
            for weight in shapes
            if len(shapes[weight]) == 2 and linear_uses(weight, consumers)[0]
            for projection in projection_names(weight)
            if fnmatch.fnmatchcase(projection, pattern)
        }
        for projection, weight in projections.items():
            chosen.setdefault(projection, projection_uses(graph, weight, projection, consumers))
        if not matched and projections:
            continue
        if not matched:
            raise ModelError(
                f"LoRA target pattern {pattern!r} matches no parameter; the parameters include {_listing(list(shapes))}"
            )
        for name in matched:
            shape = list(shapes[name])
            if len(shape) != 2:
                raise ModelError(
                    f"LoRA target {name!r} (matched by {pattern!r}) has shape {shape}: expected a weight matrix "
                    "(2-D); narrow the pattern, e.g. to '*.weight'"
                )
            uses, others = linear_uses(name, consumers)
            if others or not uses:
                raise ModelError(
                    f"LoRA target {name!r} (matched by {pattern!r}) is not used only as a MatMul/Gemm weight: "
                    f"it feeds {', '.join(others) or 'nothing'}"
                )
            chosen.setdefault(name, uses)
    return chosen


def weight_uses(graph: onnx.GraphProto, weights: Sequence[str]) -> dict[str, list[WeightUse]]:
    """The MatMul/Gemm uses of each of ``weights`` (already chosen, e.g. in the other model of a pair)."""
    consumers = consumers_of(graph)
    found = {}
    for weight in weights:
        packed = packed_weight(graph, weight)
        if packed is not None:
            found[weight] = projection_uses(graph, packed, weight, consumers)
            continue
        uses, others = linear_uses(weight, consumers)
        if others or not uses:
            raise ModelError(
                f"LoRA target {weight!r} is not used only as a MatMul/Gemm weight in this graph: "
                f"it feeds {', '.join(others) or 'nothing'}"
            )
        found[weight] = uses
    return found


def insert_adapters(
    graph: onnx.GraphProto,
    targets: Mapping[str, list[WeightUse]],
    shapes: Mapping[str, Sequence[int]],
    elem_types: Mapping[str, int],
    config: LoraConfig,
    training: bool,
) -> LoraRecord:
    """Add the adapter branches for ``targets`` to ``graph`` (A/B are declared by the caller)."""
    taken = {value for node in graph.node for value in (*node.input, *node.output)}
    taken |= {value.name for value in (*graph.input, *graph.initializer)}
    records = []
    for target_name, uses in targets.items():
        weight = target_weight(target_name, uses)
        lora_a, lora_b = adapter_names(target_name)
        for name in (lora_a, lora_b):
            if name in taken:
                raise ModelError(f"LoRA adapter name {name!r} for {weight!r} is already a value of the graph")
        transposed = uses[0].transposed
        alphas = {use.gemm_alpha for use in uses}
        if {use.transposed for use in uses} != {transposed} or len(alphas) != 1:
            raise ModelError(f"LoRA target {weight!r} is multiplied in different layouts or by different Gemm alphas")
        rows, columns = shapes[weight]
        in_features, out_features = (columns, rows) if transposed else (rows, columns)
        total = out_features
        offset, out_features = uses[0].columns or (0, out_features)
        branch_uses = [
            _insert_branch(
                graph,
                use,
                f"/lora/{target_name}/{index}",
                (lora_a, lora_b),
                elem_types[weight],
                config,
                training,
                total,
            )
            for index, use in enumerate(uses)
        ]
        columns_total = total if uses[0].columns else 0
        records.append(
            LoraTarget(
                weight,
                lora_a,
                lora_b,
                in_features,
                out_features,
                transposed,
                alphas.pop(),
                tuple(branch_uses),
                offset,
                columns_total,
            )
        )
    return LoraRecord(config.r, float(config.alpha), config.scaling, tuple(records), ())


def cast_parameters(graph: onnx.GraphProto, elem_types: Mapping[str, int]) -> tuple[tuple[str, str, int], ...]:
    """Insert ``Cast(p, to=elem_type)`` before every use of each parameter ``p``; return (p, cast output, type)."""
    casts = []
    for index, (name, elem_type) in enumerate(elem_types.items()):
        output = f"{name}/Cast/output_0"
        for node in graph.node:
            for position, value in enumerate(node.input):
                if value == name:
                    node.input[position] = output
        graph.node.insert(
            index, onnx.helper.make_node("Cast", [name], [output], name=f"/lora/{name}/Cast", to=elem_type)
        )
        casts.append((name, output, elem_type))
    return tuple(casts)


def initial_adapters(record: LoraRecord, seed: int) -> dict[str, torch.Tensor]:
    """PEFT's initialisation: A Kaiming-uniform(a=sqrt(5)) over (r, in), stored transposed; B zero."""
    generator = torch.Generator().manual_seed(seed)
    values = {}
    for target in record.targets:
        a = torch.empty(record.rank, target.in_features)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        values[target.lora_a] = a.t().contiguous()
        values[target.lora_b] = torch.zeros(record.rank, target.out_features)
    return values


def _insert_branch(
    graph: onnx.GraphProto,
    use: WeightUse,
    prefix: str,
    adapters: tuple[str, str],
    elem_type: int,
    config: LoraConfig,
    training: bool,
    total: int,
) -> LoraUse:
    node = use.node
    output, base_output = node.output[0], f"{prefix}/base/output_0"
    node.output[0] = base_output
    nodes = []
    source = use.x
    if training and config.dropout > 0:
        ratio = onnx.helper.make_tensor(f"{prefix}/dropout_ratio", onnx.TensorProto.FLOAT, [], [config.dropout])
        mode = onnx.helper.make_tensor(f"{prefix}/training_mode", onnx.TensorProto.BOOL, [], [True])
        nodes += [
            onnx.helper.make_node("Constant", [], [ratio.name], name=f"{prefix}/dropout_ratio", value=ratio),
            onnx.helper.make_node("Constant", [], [mode.name], name=f"{prefix}/training_mode", value=mode),
            onnx.helper.make_node(
                "Dropout", [source, ratio.name, mode.name], [f"{prefix}/Dropout/output_0"], name=f"{prefix}/Dropout"
            ),
        ]
        source = f"{prefix}/Dropout/output_0"
    down, unscaled, scaled = f"{prefix}/lora_A/output_0", f"{prefix}/lora_B/output_0", f"{prefix}/Mul/output_0"
    scale = onnx.helper.make_tensor(f"{prefix}/scaling", elem_type, [], [config.scaling])
    up = adapters[1]
    if use.columns is not None:  # a projection of a packed weight: B placed in its output columns
        offset, size = use.columns
        pads = onnx.helper.make_tensor(
            f"{prefix}/columns", onnx.TensorProto.INT64, [4], [0, offset, 0, total - offset - size]
        )
        up = f"{prefix}/lora_B/Pad/output_0"
        nodes += [
            onnx.helper.make_node("Constant", [], [pads.name], name=f"{prefix}/columns", value=pads),
            onnx.helper.make_node("Pad", [adapters[1], pads.name], [up], name=f"{prefix}/lora_B/Pad"),
        ]
    nodes += [
        onnx.helper.make_node("MatMul", [source, adapters[0]], [down], name=f"{prefix}/lora_A/MatMul"),
        onnx.helper.make_node("MatMul", [down, up], [unscaled], name=f"{prefix}/lora_B/MatMul"),
        onnx.helper.make_node("Constant", [], [scale.name], name=f"{prefix}/scaling", value=scale),
        onnx.helper.make_node("Mul", [unscaled, scale.name], [scaled], name=f"{prefix}/Mul"),
        onnx.helper.make_node("Add", [base_output, scaled], [output], name=f"{prefix}/Add"),
    ]
    position = list(graph.node).index(node) + 1
    for offset, inserted in enumerate(nodes):
        graph.node.insert(position + offset, inserted)
    return LoraUse(node.name, output, base_output, scaled, unscaled, tuple(n.name for n in nodes))


def _listing(names: Sequence[str], shown: int = 6) -> str:
    listed = ", ".join(repr(name) for name in names[:shown])
    return f"{listed}, ... ({len(names)} in all)" if len(names) > shown else listed
