"""ONNX element types (TensorProto numbering, as ORT's checkpoints use it): names, and the dtypes a tensor of
each can hold here, without importing torch."""

from __future__ import annotations

from typing import NamedTuple

from ort_torch_train.errors import UnsupportedTypeError

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


class ElemDtype(NamedTuple):
    """The dtype a tensor of one element type has here: its torch/numpy name and bytes per element."""

    name: str
    itemsize: int


# the element types a tensor may have here, in the order messages list them
ELEM_DTYPES: dict[int, ElemDtype] = {
    1: ElemDtype("float32", 4),
    2: ElemDtype("uint8", 1),
    3: ElemDtype("int8", 1),
    4: ElemDtype("uint16", 2),
    5: ElemDtype("int16", 2),
    6: ElemDtype("int32", 4),
    7: ElemDtype("int64", 8),
    9: ElemDtype("bool", 1),
    10: ElemDtype("float16", 2),
    11: ElemDtype("float64", 8),
    12: ElemDtype("uint32", 4),
    13: ElemDtype("uint64", 8),
    16: ElemDtype("bfloat16", 2),
}
FLOATING_ELEM_TYPES = frozenset({1, 10, 11, 16})


def elem_type_name(code: int) -> str:
    """ONNX's name for an element type code: 1 -> 'FLOAT'."""
    return ELEM_TYPE_NAMES.get(code, f"<unknown {code}>")


def ort_tensor_type(code: int) -> str:
    """ORT's spelling of a tensor type in messages: 1 -> 'tensor(float)'."""
    return f"tensor({elem_type_name(code).lower()})"


def elem_dtype(code: int, tensor_name: str = "") -> ElemDtype:
    """The dtype of an ONNX element type code; UnsupportedTypeError for a type no tensor here can have."""
    try:
        return ELEM_DTYPES[code]
    except KeyError:
        subject = f"tensor {tensor_name!r} has element type" if tensor_name else "element type"
        raise UnsupportedTypeError(
            f"{subject} {elem_type_name(code)} ({code}), which has no torch equivalent here; "
            f"supported: {', '.join(elem_type_name(c) for c in ELEM_DTYPES)}"
        ) from None
