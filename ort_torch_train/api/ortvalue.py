"""An OrtValue-like tensor handle, and conversion of user values to and from torch tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ort_torch_train.dtypes import onnx_elem_type, ort_tensor_type
from ort_torch_train.errors import InputTypeError


class OrtValue:
    """A tensor with ``onnxruntime.OrtValue``'s common methods, backed by a torch tensor (no copy).

    Args:
        tensor: the torch tensor it holds (no copy).
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise InputTypeError(f"OrtValue wraps a torch.Tensor, got {type(tensor).__name__}")
        self.tensor = tensor

    @classmethod
    def ortvalue_from_numpy(cls, array: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> OrtValue:
        """An OrtValue holding ``array`` (shared on CPU, copied to a CUDA device)."""
        tensor = numpy_to_tensor(array, "array")
        if device_type.lower() == "cuda":
            tensor = tensor.to(torch.device("cuda", device_id))
        return cls(tensor)

    def numpy(self) -> np.ndarray:
        """The value as a numpy array (shared memory on CPU)."""
        return self.tensor.detach().cpu().numpy()

    def shape(self) -> list[int]:
        """The tensor's dimensions as a list."""
        return list(self.tensor.shape)

    def data_type(self) -> str:
        """ORT's type text, e.g. ``tensor(float)``."""
        return ort_tensor_type(onnx_elem_type(self.tensor.dtype))

    def element_type(self) -> type:
        """The numpy scalar type of the elements (numpy.float32, ...)."""
        return self.numpy().dtype.type

    def device_name(self) -> str:
        """Where the tensor lives, in ORT's spelling: ``Cpu`` or ``Cuda``."""
        return _ORT_DEVICE_NAMES.get(self.tensor.device.type, self.tensor.device.type.capitalize())

    def is_tensor(self) -> bool:
        """Always True: an OrtValue here wraps a tensor."""
        return True

    def has_value(self) -> bool:
        """Always True: an OrtValue here always holds a tensor."""
        return True

    def data_ptr(self) -> int:
        """The address of the tensor's first element."""
        return self.tensor.data_ptr()

    def __repr__(self) -> str:
        return f"OrtValue(shape={self.shape()}, type={self.data_type()}, device={self.device_name()})"


_ORT_DEVICE_NAMES = {"cpu": "Cpu", "cuda": "Cuda"}
# the dtypes whose values ``Tensor.item()`` gives exactly as Python numbers, and their numpy types
_NUMPY_SCALAR_TYPES = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.bool: np.bool_,
}


def numpy_to_tensor(array: np.ndarray, name: str) -> torch.Tensor:
    """A torch view of ``array`` (a copy only when torch cannot share it: read-only or negative strides)."""
    if array.flags.writeable:  # the usual array: torch shares it, or refuses it and the checks below say why
        try:
            return torch.from_numpy(array)
        except (TypeError, ValueError):
            pass
    if array.dtype == object or array.dtype.kind in "USV":
        raise InputTypeError(f"input {name!r}: numeric array expected, got dtype {array.dtype}")
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        array = np.array(array)
    return torch.from_numpy(array)


_NDARRAY, _FROM_NUMPY = np.ndarray, torch.from_numpy  # read at every step: no module attribute lookups


def to_tensors(values: Sequence[Any], names: Sequence[str]) -> tuple[list[torch.Tensor], str]:
    """Torch tensors for user inputs, and the kind of output to give back: numpy, torch or ortvalue."""
    shared = []
    for value in values:  # the usual call: writeable numpy arrays that torch shares
        if type(value) is not _NDARRAY or not value.flags.writeable:
            break
        try:
            shared.append(_FROM_NUMPY(value))
        except (TypeError, ValueError):
            break
    else:
        if shared:
            return shared, "numpy"
    tensors: list[torch.Tensor] = []
    kinds = set()
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            kinds.add("torch")
        elif isinstance(value, np.ndarray):
            tensors.append(numpy_to_tensor(value, _input_name(names, position)))
            kinds.add("numpy")
        elif isinstance(value, OrtValue):
            tensors.append(value.tensor)
            kinds.add("ortvalue")
        elif value is not None and hasattr(value, "numpy") and type(value).__name__ == "OrtValue":
            tensors.append(numpy_to_tensor(value.numpy(), _input_name(names, position)))  # onnxruntime's own OrtValue
            kinds.add("onnxruntime")
        else:
            shown = "None" if value is None else type(value).__name__
            raise InputTypeError(
                f"input {_input_name(names, position)!r} (position {position}): "
                f"expected a numpy array, torch tensor or OrtValue, got {shown}"
            )
    if len(kinds) == 1:  # one kind for every input: the usual call
        (kind,) = kinds
        return tensors, kind
    for kind in ("onnxruntime", "ortvalue"):
        if kind in kinds:
            return tensors, kind
    return tensors, "torch" if kinds == {"torch"} else "numpy"


def _input_name(names: Sequence[str], position: int) -> str:
    return names[position] if position < len(names) else f"#{position}"


def from_tensors(outputs: Sequence[torch.Tensor], kind: str) -> Any:
    """Outputs in the caller's kind: a bare value for one output, a tuple for several."""
    converted: list[Any]
    if kind == "numpy" and len(outputs) == 1:  # the usual step: one loss
        (output,) = outputs
        scalar_type = _NUMPY_SCALAR_TYPES.get(output.dtype) if output.is_cpu and not output.dim() else None
        if scalar_type is not None:  # a new 0-d array of the value costs less than a view of the tensor
            return np.array(output.item(), scalar_type)
        return output.numpy() if output.is_cpu else output.cpu().numpy()
    if kind == "numpy":  # a CPU tensor's numpy view directly: .cpu() of one returns itself, at a cost
        converted = [output.numpy() if output.is_cpu else output.cpu().numpy() for output in outputs]
    elif kind == "ortvalue":
        converted = [OrtValue(output) for output in outputs]
    elif kind == "onnxruntime":  # onnxruntime.OrtValue in, onnxruntime.OrtValue out (code checks isinstance)
        import onnxruntime

        converted = [onnxruntime.OrtValue.ortvalue_from_numpy(output.detach().cpu().numpy()) for output in outputs]
    else:
        converted = list(outputs)
    return converted[0] if len(converted) == 1 else tuple(converted)
