"""ONNX element types (TensorProto numbering, as ORT's checkpoints use it) <-> torch dtypes."""

from __future__ import annotations

import numpy as np
import onnx
import torch

from ort_torch_train.elem_types import ELEM_TYPE_NAMES as ELEM_TYPE_NAMES  # re-exported: callers import them here
from ort_torch_train.elem_types import elem_dtype
from ort_torch_train.elem_types import elem_type_name as elem_type_name
from ort_torch_train.elem_types import ort_tensor_type as ort_tensor_type
from ort_torch_train.errors import UnsupportedTypeError

ONNX_TO_TORCH: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.uint8,
    3: torch.int8,
    4: torch.uint16,
    5: torch.int16,
    6: torch.int32,
    7: torch.int64,
    9: torch.bool,
    10: torch.float16,
    11: torch.float64,
    12: torch.uint32,
    13: torch.uint64,
    16: torch.bfloat16,
}
TORCH_TO_ONNX: dict[torch.dtype, int] = {dtype: code for code, dtype in ONNX_TO_TORCH.items()}


def dtype_name(dtype: torch.dtype | np.dtype) -> str:
    """A short readable name: float32, int64, bfloat16, ..."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(code: int, tensor_name: str = "") -> torch.dtype:
    """The torch dtype of an ONNX element type code."""
    elem_dtype(code, tensor_name)  # UnsupportedTypeError for a type without one
    return ONNX_TO_TORCH[code]


def onnx_elem_type(dtype: torch.dtype, tensor_name: str = "") -> int:
    """The ONNX element type code of a torch dtype."""
    try:
        return TORCH_TO_ONNX[dtype]
    except KeyError:
        subject = f"tensor {tensor_name!r} has dtype" if tensor_name else "dtype"
        raise UnsupportedTypeError(
            f"{subject} {dtype_name(dtype)}, which has no ONNX equivalent; "
            f"supported: {', '.join(dtype_name(d) for d in TORCH_TO_ONNX)}"
        ) from None


def tensor_from_proto(proto: onnx.TensorProto) -> torch.Tensor:
    """A torch tensor holding a TensorProto's value (bfloat16 included)."""
    if proto.data_type == onnx.TensorProto.BFLOAT16:
        array = onnx.numpy_helper.to_array(proto)
        return torch.from_numpy(np.asarray(array, dtype=np.float32).copy()).to(torch.bfloat16)
    return torch.from_numpy(np.array(onnx.numpy_helper.to_array(proto)))


def tensor_to_proto(tensor: torch.Tensor, name: str) -> onnx.TensorProto:
    """A TensorProto holding a torch tensor's value (bfloat16 included)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        proto = onnx.TensorProto(name=name, data_type=onnx.TensorProto.BFLOAT16, dims=list(tensor.shape))
        proto.raw_data = tensor.contiguous().view(torch.int16).numpy().tobytes()
        return proto
    return onnx.numpy_helper.from_array(tensor.contiguous().numpy(), name=name)
