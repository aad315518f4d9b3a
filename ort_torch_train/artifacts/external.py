"""Base models past protobuf's 2 GB: the graph edited as a light proto, the weights held beside it.

A light model's large initializers are data-less external references; their data are torch tensors
(memory-mapped from the base model's external data files, or taken from an in-memory proto) that go
straight to the checkpoint and, for initializers that stay in the models, to ``<model>.data``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import onnx
import torch

from ort_torch_train.dtypes import tensor_from_proto
from ort_torch_train.errors import ModelError
from ort_torch_train.export.external_data import (
    MIN_EXTERNAL_BYTES,
    external_reference,
    initializer_bytes,
    is_external,
    tensor_nbytes,
    weights_in_files,
    without_initializers,
)
from ort_torch_train.graph.layout import load_model


def light_model_from_file(path: Path) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    """The model at ``path`` with its external data left on disk, and those data memory-mapped."""
    model = load_model(path, "base model", external_data=False)
    return model, weights_in_files(model, path.parent)


def detach_weights(model: onnx.ModelProto, threshold: int) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    """``model`` itself when its initializers fit under ``threshold`` bytes, else a light copy and the data
    of the inline initializers it made external (those already external are kept as they are).

    ``model`` is not modified.
    """
    if initializer_bytes(model) <= threshold:
        return model, {}
    light = without_initializers(model)
    weights = {}
    for init in model.graph.initializer:
        if is_external(init) or tensor_nbytes(init) < MIN_EXTERNAL_BYTES or init.data_type == onnx.TensorProto.STRING:
            light.graph.initializer.add().CopyFrom(init)
        else:
            light.graph.initializer.append(external_reference(init))
            weights[init.name] = tensor_from_proto(init)
    return light, weights


def require_inline(model: onnx.ModelProto) -> None:
    """Refuse an in-memory model whose initializers refer to external data files (they cannot be located)."""
    if any(is_external(init) for init in model.graph.initializer):
        raise ModelError(
            "the base model's initializers refer to external data files, which an in-memory model cannot locate: "
            "pass the model's path to generate_artifacts instead"
        )


def checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose external initializers are graph inputs of the same type: the ONNX checker needs no data."""
    skeleton = copy.deepcopy(model)
    graph = skeleton.graph
    inputs = {value.name for value in graph.input}
    external = [init for init in graph.initializer if is_external(init)]
    kept = [init for init in graph.initializer if not is_external(init)]
    graph.input.extend(
        onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        for init in external
        if init.name not in inputs
    )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return skeleton
