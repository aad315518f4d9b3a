"""Adding LoRA adapters to a base model (``generate_artifacts(lora=)``) or to training artifacts (``Module(lora=)``)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Sequence

import onnx
import torch

from ort_torch_train.dtypes import onnx_elem_type, tensor_from_proto, tensor_to_proto, torch_dtype
from ort_torch_train.errors import ModelError
from ort_torch_train.graph.layout import (
    GRAD_BUFFER_SUFFIX,
    LAZY_RESET_GRAD,
    opsets_of,
    prune_graph,
    training_layout,
)
from ort_torch_train.lora.config import LORA_PROPERTY, LoraConfig
from ort_torch_train.lora.insert import (
    cast_parameters,
    initial_adapters,
    insert_adapters,
    select_targets,
    weight_uses,
)
from ort_torch_train.lora.packed import target_weight
from ort_torch_train.lora.record import LoraRecord, read_record, write_record
from ort_torch_train.lora.uses import consumers_of, linear_uses, quantization_parameters, quantized_weights
from ort_torch_train.state.training_state import TrainingState

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def add_lora_to_base(
    base: onnx.ModelProto,
    requires_grad: Sequence[str] | None,
    frozen_params: Sequence[str] | None,
    config: LoraConfig,
) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """A copy of ``base`` with adapters as initializers, and its (trainable, frozen) parameter names.

    The adapters are the trainable parameters; the targeted weights and every parameter named in
    ``requires_grad`` or ``frozen_params`` are frozen.
    """
    model = copy.deepcopy(base)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    shapes = {name: list(init.dims) for name, init in initializers.items() if init.data_type in FLOAT_TYPES}
    quantized = {name: found for name, found in quantized_weights(graph).items() if name in initializers}
    for name in quantization_parameters(graph):
        shapes.pop(name, None)
    shapes.update((name, shape) for name, (shape, _) in quantized.items())
    targets = select_targets(graph, shapes, config)
    weights = [target_weight(name, uses) for name, uses in targets.items()]
    elem_types = {  # a packed weight's adapters take its scales' type
        name: initializers[quantized[name][1] if name in quantized else name].data_type for name in weights
    }
    record = insert_adapters(graph, targets, shapes, elem_types, config, training=True)
    values = initial_adapters(record, config.seed)
    for target in record.targets:
        dtype = torch_dtype(elem_types[target.weight], target.weight)
        graph.initializer.extend(
            tensor_to_proto(values[name].to(dtype), name) for name in (target.lora_a, target.lora_b)
        )
    frozen = list(dict.fromkeys([*(requires_grad or ()), *(frozen_params or ()), *weights]))
    if config.frozen_dtype is not None:
        record = _cast_frozen_initializers(model, frozen, config.frozen_dtype, record)
    write_record(model, record)
    return model, record.adapter_names(), frozen


def add_lora_to_artifacts(
    training_model: onnx.ModelProto,
    eval_model: onnx.ModelProto | None,
    state: TrainingState,
    config: LoraConfig,
) -> tuple[onnx.ModelProto, onnx.ModelProto | None]:
    """The training model (cut to its forward) and eval model with adapters; ``state`` gains them.

    The adapters become the state's only trainable parameters (created with PEFT's initialisation,
    or kept when the state already holds them, e.g. from a LoRA checkpoint); every other parameter is
    frozen, its gradient and moments dropped, and held in ``config.frozen_dtype`` when given. The
    config is kept in the state's properties (``LORA_PROPERTY``) so that later runs can re-apply it.
    """
    if read_record(training_model) is not None:
        raise ModelError(
            "the training model already carries LoRA adapters (made by generate_artifacts(lora=...)): "
            "train it without lora="
        )
    if state.is_nominal:
        raise ModelError("LoRA needs the parameters' values: load a full checkpoint, not a nominal one")
    training = _forward_model(training_model, list(state.params))
    inputs = {value.name: value for value in training.graph.input if value.name in state.params}
    shapes = {name: list(state.params[name].shape) for name in inputs}
    elem_types = {name: value.type.tensor_type.elem_type for name, value in inputs.items()}
    excluded = quantization_parameters(training.graph)
    candidates = {n: s for n, s in shapes.items() if elem_types[n] in FLOAT_TYPES and n not in excluded}
    constants = {init.name: init.data_type for init in training.graph.initializer}
    for name, (shape, scales) in quantized_weights(training.graph).items():
        scales_type = elem_types.get(scales, constants.get(scales))
        if (name in inputs or name in constants) and scales_type is not None:
            # a packed weight (a frozen parameter or, without frozen_params, a graph constant): its adapters
            # take its scales' type
            shapes[name] = candidates[name] = shape
            elem_types[name] = scales_type
    try:
        targets = select_targets(training.graph, candidates, config)
    except ModelError as error:
        raise ModelError(f"{error}{_constant_weights_hint(training.graph, candidates)}") from None
    record = insert_adapters(training.graph, targets, shapes, elem_types, config, training=True)
    models = [(training, record)]
    evaluation = None
    if eval_model is not None:
        evaluation = copy.deepcopy(eval_model)
        uses = weight_uses(evaluation.graph, list(targets))
        models.append((evaluation, insert_adapters(evaluation.graph, uses, shapes, elem_types, config, training=False)))
    _add_adapters_to_state(state, record, config, elem_types)
    state.properties[LORA_PROPERTY] = config.to_json()
    for model, model_record in models:
        for target in record.targets:
            for name, shape in (
                (target.lora_a, [target.in_features, record.rank]),
                (target.lora_b, [record.rank, target.out_features]),
            ):
                model.graph.input.append(onnx.helper.make_tensor_value_info(name, elem_types[target.weight], shape))
        write_record(model, dataclasses.replace(model_record, casts=_cast_to_state(model, state)))
    return training, evaluation


def _constant_weights_hint(graph: onnx.GraphProto, candidates: Iterable[str]) -> str:
    """A note on the float weight matrices the graph holds as constants (not checkpoint parameters), or ''."""
    known = set(candidates)
    consumers = consumers_of(graph)
    constants = [
        init.name
        for init in graph.initializer
        if init.name not in known
        and init.data_type in FLOAT_TYPES
        and len(init.dims) == 2
        and linear_uses(init.name, consumers)[0]
    ]
    if not constants:
        return ""
    return (
        f"; the graph holds {len(constants)} weight matrices as constants, not checkpoint parameters "
        f"(e.g. {constants[0]!r}): make the artifacts with those weights in frozen_params, or add the adapters "
        "there with generate_artifacts(lora=...)"
    )


def _forward_model(model: onnx.ModelProto, param_names: list[str]) -> onnx.ModelProto:
    """``model`` cut to what its user outputs need: ORT's gradient graph goes (torch autograd replaces it)."""
    layout = training_layout(model, param_names)
    pruned = prune_graph(model.graph, layout.user_outputs)
    del pruned.input[:]
    pruned.input.extend(
        value
        for value in model.graph.input
        if not value.name.endswith(GRAD_BUFFER_SUFFIX) and value.name != LAZY_RESET_GRAD
    )
    forward = onnx.ModelProto()
    forward.CopyFrom(model)
    forward.graph.CopyFrom(pruned)
    return forward


def _add_adapters_to_state(
    state: TrainingState, record: LoraRecord, config: LoraConfig, elem_types: dict[str, int]
) -> None:
    initial = initial_adapters(record, config.seed)
    adapters = set(record.adapter_names())
    state.freeze([name for name in state.params if name not in adapters], config.frozen_dtype)
    device = state.device
    for target in record.targets:
        dtype = torch_dtype(elem_types[target.weight], target.weight)
        for name in (target.lora_a, target.lora_b):
            value = initial[name].to(device=device, dtype=dtype)
            held = state.params.get(name)
            if held is not None:
                if held.shape != value.shape:
                    raise ModelError(
                        f"the state's adapter {name!r} has shape {list(held.shape)}, the LoRA config gives "
                        f"{list(value.shape)} (r={record.rank})"
                    )
                value = held.detach()
            state.add_trainable(name, value)


def _cast_to_state(model: onnx.ModelProto, state: TrainingState) -> tuple[tuple[str, str, int], ...]:
    """Cast the parameters the state holds in another dtype than the graph declares back to the graph's type."""
    differing = {}
    for value in model.graph.input:
        param = state.params.get(value.name)
        declared = value.type.tensor_type.elem_type
        if param is not None and onnx_elem_type(param.dtype, value.name) != declared:
            differing[value.name] = declared
            value.type.tensor_type.elem_type = onnx_elem_type(param.dtype, value.name)
    if differing:
        _require_cast_opset(model)
    return cast_parameters(model.graph, differing)


def _cast_frozen_initializers(
    model: onnx.ModelProto, frozen: Iterable[str], dtype: torch.dtype, record: LoraRecord
) -> LoraRecord:
    names = set(frozen)
    differing = {}
    for index, init in enumerate(model.graph.initializer):
        if init.name in names and init.data_type == onnx.TensorProto.FLOAT:
            differing[init.name] = init.data_type
            model.graph.initializer[index].CopyFrom(tensor_to_proto(tensor_from_proto(init).to(dtype), init.name))
    if differing:
        _require_cast_opset(model)
    return dataclasses.replace(record, casts=cast_parameters(model.graph, differing))


def _require_cast_opset(model: onnx.ModelProto) -> None:
    opset = opsets_of(model).get("", 0)
    if opset < 13:
        raise ModelError(
            f"LoRA frozen_dtype needs opset 13 or later (Cast from bfloat16/float16); the model has {opset}"
        )
