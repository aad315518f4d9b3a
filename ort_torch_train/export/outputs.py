"""The graph outputs a user can export for inference: the model's own outputs, before the loss.

``generate_artifacts`` records the base model's outputs in the eval model's metadata. For artifacts
made by ORT, they are guessed: the computed values the loss combines with the labels (the last user
input). Any value of the eval graph can be exported; these are the ones people want.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import onnx

MODEL_OUTPUTS_KEY = "ort_torch_train.model_outputs"
LOSS_UNARY_OPS = frozenset({"Sigmoid", "Log", "Neg", "Abs", "Cast", "Softmax", "LogSoftmax"})


def record_model_outputs(eval_model: onnx.ModelProto, names: Iterable[str]) -> None:
    """Note the base model's output names in ``eval_model``'s metadata."""
    eval_model.metadata_props.add(key=MODEL_OUTPUTS_KEY, value=json.dumps(list(names)))


def exportable_output_names(eval_model: onnx.ModelProto, param_names: Iterable[str]) -> list[str]:
    """The model outputs (recorded, else guessed), then the eval graph's outputs (the loss)."""
    recorded = next((p.value for p in eval_model.metadata_props if p.key == MODEL_OUTPUTS_KEY), None)
    graph = eval_model.graph
    names = json.loads(recorded) if recorded is not None else _guessed(graph, set(param_names))
    return list(dict.fromkeys([*names, *(value.name for value in graph.output)]))


def _guessed(graph: onnx.GraphProto, params: set[str]) -> list[str]:
    user_inputs = [value.name for value in graph.input if value.name not in params]
    if not user_inputs:
        return []
    labels = user_inputs[-1]
    producers = {output: node for node in graph.node for output in node.output}
    found = []
    for name in (name for node in graph.node if labels in node.input for name in node.input if name in producers):
        while producers[name].op_type in LOSS_UNARY_OPS and producers[name].input[0] in producers:
            name = producers[name].input[0]  # Log(Sigmoid(logits)) of a BCE loss -> logits
        found.append(name)
    return found
