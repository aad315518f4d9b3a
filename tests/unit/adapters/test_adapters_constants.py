"""Constant, ConstantOfShape, Range, Cast, CastLike."""

import numpy as np
import onnx
import pytest

from tests.helpers.adapter_harness import check, check_dynamic, check_gradients, rand

I64 = np.int64


@pytest.mark.parametrize(
    "attrs",
    [
        {"value": onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))},
        {"value": onnx.numpy_helper.from_array(np.array([1, 2], np.int32))},
        {"value_float": 2.5},
        {"value_floats": [1.0, 2.0]},
        {"value_int": 7},
        {"value_ints": [3, 4, 5]},
    ],
)
@pytest.mark.parametrize("opset", [13, 19, 21])
def test_constant(attrs, opset):
    check("Constant", [], opset=opset, **attrs)


def test_constant_string_is_unsupported():
    with pytest.raises(Exception, match="value_string"):
        check("Constant", [], opset=13, value_string="text")


@pytest.mark.parametrize(
    "value",
    [
        None,
        onnx.numpy_helper.from_array(np.array([3], np.int32)),
        onnx.numpy_helper.from_array(np.array([1.5], np.float32)),
    ],
)
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": value}
    check("ConstantOfShape", [np.array([2, 3], I64)], constant=[0], opset=20, **attrs)
    check_dynamic("ConstantOfShape", [np.array([2, 3], I64)], opset=20, **attrs)


@pytest.mark.parametrize("start, limit, delta", [(0, 5, 1), (10, 2, -3), (1, 1, 1), (0.5, 2.0, 0.25), (3, 0, 1)])
def test_range(start, limit, delta):
    dtype = np.float32 if isinstance(start, float) else np.int64
    inputs = [np.array(v, dtype) for v in (start, limit, delta)]
    check("Range", inputs, constant=[0, 1, 2], opset=11)
    check_dynamic("Range", inputs, opset=11)


@pytest.mark.parametrize(
    "source, to",
    [
        (np.float32, onnx.TensorProto.INT64),
        (np.float32, onnx.TensorProto.DOUBLE),
        (np.float32, onnx.TensorProto.BOOL),
        (np.int64, onnx.TensorProto.FLOAT),
        (np.int32, onnx.TensorProto.INT64),
        (np.bool_, onnx.TensorProto.FLOAT),
        (np.float32, onnx.TensorProto.FLOAT16),
    ],
)
@pytest.mark.parametrize("opset", [13, 19, 21])
def test_cast(source, to, opset):
    x = (rand(3, 4) * 3).astype(source)
    check("Cast", [x], opset=opset, to=to)


def test_cast_to_string_is_unsupported():
    with pytest.raises(Exception, match="STRING"):
        check("Cast", [rand(2)], opset=13, to=onnx.TensorProto.STRING)


def test_cast_like():
    check("CastLike", [rand(3, 2) * 4, np.zeros(1, np.int32)], constant=[1], opset=15)
    check("CastLike", [rand(3, 2, dtype=np.int64), np.zeros(1, np.float64)], opset=21)
    check_gradients("CastLike", [rand(3, 2), np.zeros(1, np.float64)], constant=[1], opset=15)
