"""The contiguous-buffer face of ORT's ``Module``: the parameters' element count, a flat copy of them, and a
flat buffer copied into them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ort_torch_train.api.ortvalue import OrtValue, numpy_to_tensor
from ort_torch_train.errors import InputTypeError
from ort_torch_train.training.engine import TrainingEngine


class ContiguousParameters:
    """ORT's contiguous-buffer methods over a face's ``_engine`` (``Module`` takes them from here)."""

    _engine: TrainingEngine

    def parameters_size(self, trainable_only: bool = True) -> int:
        """Number of elements of the (trainable) parameters."""
        return self._engine.parameters_size(trainable_only)

    def contiguous_parameters(self, trainable_only: bool = False) -> torch.Tensor:
        """A 1-D float32 copy of the parameters, in the training graph's parameter order."""
        return self._engine.contiguous_parameters(trainable_only)

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """Number of parameter elements (trainable ones only by default)."""
        return self.parameters_size(trainable_only)

    def get_contiguous_parameters(self, trainable_only: bool = False) -> OrtValue:
        """A flat float32 copy of the parameters in the training graph's order."""
        return OrtValue(self.contiguous_parameters(trainable_only))

    def copy_buffer_to_parameters(self, buffer: Any, trainable_only: bool = True) -> None:
        """Copy a flat float32 buffer (OrtValue, numpy array or tensor) into the parameters."""
        if isinstance(buffer, OrtValue):
            tensor = buffer.tensor
        elif isinstance(buffer, np.ndarray):
            tensor = numpy_to_tensor(buffer, "buffer")
        elif isinstance(buffer, torch.Tensor):
            tensor = buffer
        elif hasattr(buffer, "numpy"):
            tensor = numpy_to_tensor(buffer.numpy(), "buffer")
        else:
            raise InputTypeError(f"buffer: expected an OrtValue, numpy array or tensor, got {type(buffer).__name__}")
        with self._engine.training_state.lock:
            self._engine.copy_buffer_to_parameters(tensor, trainable_only)
