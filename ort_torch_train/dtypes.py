"""ONNX element types (TensorProto numbering, as ORT's checkpoints use it) <-> torch dtypes."""

from __future__ import annotations

import numpy as np
import onnx
import torch

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

ELEM_TYPE_NAMES: dict[int, str] = {
    0: "UNDEFINED",
    1: "FLOAT",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "STRING",
    9: "BOOL",
    10: "FLOAT16",
    11: "DOUBLE",
    12: "UINT32",
    13: "UINT64",
    14: "COMPLEX64",
    15: "COMPLEX128",
    16: "BFLOAT16",
    17: "FLOAT8E4M3FN",
    18: "FLOAT8E4M3FNUZ",
    19: "FLOAT8E5M2",
    20: "FLOAT8E5M2FNUZ",
}


def elem_type_name(code: int) -> str:
    """ONNX's name for an element type code: 1 -> 'FLOAT'."""
    return ELEM_TYPE_NAMES.get(code, f"<unknown {code}>")


def ort_tensor_type(code: int) -> str:
    """ORT's spelling of a tensor type in messages: 1 -> 'tensor(float)'."""
    return f"tensor({elem_type_name(code).lower()})"


def dtype_name(dtype: torch.dtype | np.dtype) -> str:
    """A short readable name: float32, int64, bfloat16, ..."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(code: int, tensor_name: str = "") -> torch.dtype:
    """The torch dtype of an ONNX element type code."""
    try:
        return ONNX_TO_TORCH[code]
    except KeyError:
        subject = f"tensor {tensor_name!r} has element type" if tensor_name else "element type"
        raise UnsupportedTypeError(
            f"{subject} {elem_type_name(code)} ({code}), which has no torch equivalent here; "
            f"supported: {', '.join(elem_type_name(c) for c in ONNX_TO_TORCH)}"
        ) from None


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
