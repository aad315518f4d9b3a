"""ONNX element types <-> torch dtypes <-> readable names."""

from __future__ import annotations

import numpy as np
import onnx
import torch

_ONNX_TO_TORCH: dict[int, torch.dtype] = {
    onnx.TensorProto.FLOAT: torch.float32,
    onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT16: torch.uint16,
    onnx.TensorProto.INT16: torch.int16,
    onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT64: torch.int64,
    onnx.TensorProto.BOOL: torch.bool,
    onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.UINT32: torch.uint32,
    onnx.TensorProto.UINT64: torch.uint64,
    onnx.TensorProto.BFLOAT16: torch.bfloat16,
}
_TORCH_TO_ONNX = {dtype: elem for elem, dtype in _ONNX_TO_TORCH.items()}


def torch_dtype(elem_type: int) -> torch.dtype:
    """The torch dtype of an ONNX element type."""
    try:
        return _ONNX_TO_TORCH[elem_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type
        raise TypeError(f"ONNX element type {name} has no torch equivalent") from None


def onnx_elem_type(dtype: torch.dtype) -> int:
    """The ONNX element type of a torch dtype."""
    try:
        return _TORCH_TO_ONNX[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no ONNX equivalent") from None


def dtype_name(dtype: torch.dtype | np.dtype) -> str:
    """A short readable name: float32, int64, bfloat16, ..."""
    return str(dtype).removeprefix("torch.")


def onnx_type_name(elem_type: int) -> str:
    """ORT's spelling of a tensor type: tensor(float), tensor(int64), ..."""
    return f"tensor({onnx.helper.tensor_dtype_to_string(elem_type).removeprefix('TensorProto.').lower()})"


def tensor_from_proto(proto: onnx.TensorProto) -> torch.Tensor:
    """A torch tensor holding a TensorProto's value (bfloat16 included)."""
    if proto.data_type == onnx.TensorProto.BFLOAT16:
        array = onnx.numpy_helper.to_array(proto)
        as_float = np.asarray(array, dtype=np.float32)
        return torch.from_numpy(as_float.copy()).to(torch.bfloat16)
    return torch.from_numpy(np.array(onnx.numpy_helper.to_array(proto)))


def tensor_to_proto(tensor: torch.Tensor, name: str) -> onnx.TensorProto:
    """A TensorProto holding a torch tensor's value (bfloat16 included)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        proto = onnx.TensorProto(name=name, data_type=onnx.TensorProto.BFLOAT16, dims=list(tensor.shape))
        proto.raw_data = tensor.contiguous().view(torch.int16).numpy().tobytes()
        return proto
    return onnx.numpy_helper.from_array(tensor.contiguous().numpy(), name=name)
