"""A graph's initializers taken out of its proto once, as tensors that every conversion of the graph binds
as they are: a weight left as a graph constant is then held once, not by the proto and again by each
converted module."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import torch

from ort_torch_train.dtypes import tensor_from_proto
from ort_torch_train.graph.layout import graph_without_initializers


def lift_initializers(graph: onnx.GraphProto) -> tuple[onnx.GraphProto, dict[str, torch.Tensor]]:
    """A copy of ``graph`` without its initializers, and their values by name (for ``convert_graph``'s
    ``constants``). ``graph`` itself is left as it is: a caller that drops it frees the proto's copy."""
    return graph_without_initializers(graph), initializer_tensors(graph, (init.name for init in graph.initializer))


def initializer_tensors(
    graph: onnx.GraphProto, names: Iterable[str], shared: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The values of ``graph``'s initializers named in ``names``, by name. One whose value equals the tensor
    of its name in ``shared`` is that tensor (an eval graph binds the training graph's constants)."""
    wanted, shared = set(names), shared or {}
    tensors = {}
    for init in graph.initializer:
        if init.name in wanted:
            same = shared.get(init.name)
            tensors[init.name] = same if same is not None and _holds(init, same) else tensor_from_proto(init)
    return tensors


def _holds(proto: onnx.TensorProto, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds ``proto``'s value: same dtype, shape and bytes (compared without a copy of
    ``proto``'s data)."""
    if tensor.dtype == torch.bfloat16 or tensor.device.type != "cpu":
        return False
    array, held = onnx.numpy_helper.to_array(proto), tensor.detach().numpy()
    return array.dtype == held.dtype and array.shape == held.shape and np.array_equal(array, held)
