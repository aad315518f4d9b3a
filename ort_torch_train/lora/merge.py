"""Undoing a LoRA rewrite for export: folding the adapters into the weights, or keeping them as inputs."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import onnx
import torch

from ort_torch_train.dtypes import torch_dtype
from ort_torch_train.errors import ModelError
from ort_torch_train.lora.record import LoraRecord, drop_record, read_record


def merged_for_inference(
    eval_model: onnx.ModelProto, params: Mapping[str, torch.Tensor]
) -> tuple[onnx.ModelProto, Mapping[str, torch.Tensor]]:
    """The eval model without adapter branches and the parameters with ``W + scaling * A @ B`` folded in.

    A model without adapters comes back as it is.
    """
    record = read_record(eval_model)
    if record is None:
        return eval_model, params
    model = stripped_model(eval_model, record, keep_adapters=False)
    merged = dict(uncast_parameters(params, record))
    for target in record.targets:
        a, b = merged.pop(target.lora_a), merged.pop(target.lora_b)
        weight = merged.get(target.weight)
        if weight is None or not weight.is_floating_point():
            raise ModelError(
                f"LoRA target {target.weight!r} is a quantised or constant weight: its adapter cannot be merged "
                "into it; export the unmerged model and the adapter file (export_for_genai, export_unmerged_model)"
            )
        delta = (a.detach().double() @ b.detach().double()) * (record.scaling / target.gemm_alpha)
        if target.columns_total:  # a projection of a packed weight: its columns of the output
            start = target.column_offset
            delta = torch.nn.functional.pad(delta, (start, target.columns_total - start - target.out_features))
        merged[target.weight] = (weight.detach().double() + (delta.t() if target.transposed else delta)).to(
            weight.dtype
        )
    return model, merged


def stripped_model(eval_model: onnx.ModelProto, record: LoraRecord, keep_adapters: bool) -> onnx.ModelProto:
    """A copy of ``eval_model`` without the frozen parameters' casts and without its adapter branches
    (``keep_adapters=False``) or without only their scale (``keep_adapters=True``: B carries it)."""
    model = copy.deepcopy(eval_model)
    graph = model.graph
    dropped: set[str] = set()
    renamed: dict[str, str] = {}
    for target in record.targets:
        for use in target.uses:
            if keep_adapters:
                dropped.update(name for name in use.nodes if name.endswith(("/Mul", "/scaling")))
                renamed[use.scaled] = use.unscaled
            else:
                dropped.update(use.nodes)
                renamed[use.base_output] = use.output
    for parameter, output, _ in record.casts:
        dropped.add(f"/lora/{parameter}/Cast")
        renamed[output] = parameter
    for name in list(renamed):  # several branches on one product (projections of a packed weight) chain
        seen = {name}
        while renamed[name] in renamed and renamed[name] not in seen:
            seen.add(renamed[name])
            renamed[name] = renamed[renamed[name]]
    kept = [node for node in graph.node if node.name not in dropped]
    for node in kept:
        for position, value in enumerate(node.input):
            node.input[position] = renamed.get(value, value)
        for position, value in enumerate(node.output):
            node.output[position] = renamed.get(value, value)
    del graph.node[:]
    graph.node.extend(kept)
    elem_types = {parameter: elem_type for parameter, _, elem_type in record.casts}
    adapters = set(record.adapter_names())
    inputs = [value for value in graph.input if keep_adapters or value.name not in adapters]
    for value in inputs:
        if value.name in elem_types:
            value.type.tensor_type.elem_type = elem_types[value.name]
    del graph.input[:]
    graph.input.extend(inputs)
    drop_record(model)
    return model


def uncast_parameters(params: Mapping[str, torch.Tensor], record: LoraRecord) -> dict[str, torch.Tensor]:
    """``params`` with the frozen parameters held in ``frozen_dtype`` back in their graph dtype."""
    restored = {name: tensor.detach() for name, tensor in params.items()}
    for parameter, _, elem_type in record.casts:
        restored[parameter] = restored[parameter].to(torch_dtype(elem_type, parameter))
    return restored
