"""The training graph's parameters as one flat float32 buffer (ORT's ``CopyParametersToBuffer`` and back)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import torch

from ort_torch_train.errors import InputError, InputTypeError, ModelError, NominalStateError
from ort_torch_train.graph.layout import declared_shape
from ort_torch_train.state.training_state import TrainingState


class ParameterBuffer:
    """Copies between a state's parameters and one 1-D float32 buffer, in the training graph's order.

    ``names`` are the training graph's parameters, ``trainable_names`` those of them that are trained;
    the sizes are the shapes the training model declares for them.
    """

    def __init__(
        self, state: TrainingState, model: onnx.ModelProto, names: Sequence[str], trainable_names: Sequence[str]
    ) -> None:
        self.state = state
        self.names = list(names)
        self.trainable_names = list(trainable_names)
        self.shapes = _declared_shapes(model, names)

    def size(self, trainable_only: bool) -> int:
        """Number of elements of the (trainable) parameters."""
        return sum(_numel(self.shapes[n]) for n in self._names(trainable_only))

    def copy_out(self, trainable_only: bool, device: torch.device) -> torch.Tensor:
        """A 1-D float32 copy of the (trainable) parameters' whole values (an empty one on ``device`` for none);
        a collective where processes hold parts of them (``TrainingState.whole_parameter``)."""
        if self.state.is_nominal:
            raise NominalStateError(
                "Cannot copy parameters from a nominal checkpoint state. Please load the model parameters first."
            )
        names = self._names(trainable_only)
        params = [self.state.whole_parameter(n) for n in names]
        _require_float(params, names)
        if not params:
            return torch.empty(0, dtype=torch.float32, device=device)
        return torch.cat([p.detach().reshape(-1) for p in params])

    def copy_in(self, buffer: torch.Tensor, trainable_only: bool, device: torch.device) -> None:
        """Copy a 1-D float32 buffer into the (trainable) parameters on ``device`` (completes a nominal state)."""
        state = self.state
        if state.is_nominal and trainable_only:
            raise NominalStateError(
                "For nominal checkpoint state, all parameters need to be loaded into the model (trainable_only = false)."
            )
        if not isinstance(buffer, torch.Tensor):
            raise InputTypeError(f"buffer: expected a 1-D float32 tensor, got {type(buffer).__name__}")
        if buffer.dtype != torch.float32 or buffer.dim() != 1:
            raise InputTypeError(
                f"buffer: expected a 1-D float32 tensor, got {buffer.dtype} of shape {tuple(buffer.shape)}"
            )
        names = self._names(trainable_only)
        expected = self.size(trainable_only)
        if buffer.numel() != expected:
            raise InputError(f"Parameters buffer size incorrect. Expected:{expected}, Actual:{buffer.numel()}")
        chunks = torch.split(buffer, [_numel(self.shapes[n]) for n in names])
        values = {n: chunk.reshape(self.shapes[n]) for n, chunk in zip(names, chunks)}
        if state.is_nominal:
            missing = [n for n in state.params if n not in values]
            if missing:
                raise InputError(f"buffer does not cover parameter {missing[0]!r} of the nominal state")
            state.complete_nominal({n: v.to(device).clone() for n, v in values.items()})
            return
        _require_float([state.params[n] for n in names], names)
        state.copy_whole_values(values)  # a sharded parameter takes this rank's piece of its whole value

    def _names(self, trainable_only: bool) -> list[str]:
        return list(self.trainable_names if trainable_only else self.names)


def _declared_shapes(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    by_name = {value.name: value for value in model.graph.input}
    shapes = {}
    for name in names:
        dims = declared_shape(by_name[name])
        shape = tuple(d for d in dims or () if isinstance(d, int))
        if dims is None or len(shape) != len(dims):
            raise ModelError(f"training model declares parameter {name!r} without a fixed shape: {dims}")
        shapes[name] = shape
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size


def _require_float(params: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    for name, param in zip(names, params):
        if param.dtype != torch.float32:
            raise InputTypeError(f"Only float is supported: parameter {name!r} is {param.dtype}")
