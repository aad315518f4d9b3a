"""A torch model exported to ONNX as its training graph (legacy exporter at opset 17, or dynamo), and its trainable
parameters made graph inputs as ORT's eval models feed them: what the exporter tests and the converted-graph
benchmark convert."""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping

import onnx
import torch
from torch import nn


def export_training_graph(model: nn.Module, x: torch.Tensor, dynamo: bool) -> onnx.ModelProto:
    """``model`` at ``x`` as ONNX: dynamo's export (not optimised), else the legacy exporter's at opset 17 in
    training mode, constants unfolded. Exporter warnings are silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            return torch.onnx.export(model, (x,), dynamo=True, optimize=False, verbose=False).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(
            model,
            (x,),
            buffer,
            opset_version=17,
            dynamo=False,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
        )
        return onnx.load_from_string(buffer.getvalue())


def parameters_as_inputs(proto: onnx.ModelProto, parameters: Mapping[str, torch.Tensor]) -> list[str]:
    """Move the initializers named in ``parameters`` to graph inputs (after the existing ones), in place; their
    names in input order."""
    graph = proto.graph
    moved = [init for init in graph.initializer if init.name in parameters]
    graph.input.extend(onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in moved)
    kept = [init for init in graph.initializer if init.name not in parameters]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return [init.name for init in moved]
