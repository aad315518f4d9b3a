"""A graph's initializers taken out of its proto once, as tensors that every conversion of the graph binds
as they are: a weight left as a graph constant is then held once, not by the proto and again by each
converted module."""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import torch

from ort_torch_train.dtypes import tensor_from_proto
from ort_torch_train.graph.layout import graph_without_initializers


def lift_initializers(graph: onnx.GraphProto) -> tuple[onnx.GraphProto, dict[str, torch.Tensor]]:
    """A copy of ``graph`` without its initializers, and their values by name (for ``convert_graph``'s
    ``constants``). ``graph`` itself is left as it is: a caller that drops it frees the proto's copy."""
    return graph_without_initializers(graph), initializer_tensors(graph, (init.name for init in graph.initializer))


def initializer_tensors(graph: onnx.GraphProto, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The values of ``graph``'s initializers named in ``names``, by name."""
    wanted = set(names)
    return {init.name: tensor_from_proto(init) for init in graph.initializer if init.name in wanted}
