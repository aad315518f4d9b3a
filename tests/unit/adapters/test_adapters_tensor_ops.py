"""Softmax, LogSoftmax, Trilu, OneHot, ScatterElements."""

import numpy as np
import pytest

from tests.helpers.adapter_harness import check, check_dynamic, check_gradients, rand

I64 = np.int64


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2])
def test_softmax(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    reference = "ort" if opset < 13 else "onnx"  # the reference evaluator has only the opset-13 semantics
    check(op, [rand(2, 3, 4)], opset=opset, atol=1e-5, reference=reference, **attrs)
    if axis in (None, 1):
        check_gradients(op, [rand(2, 3, 4)], opset=opset, **attrs)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -2])
def test_trilu(upper, k):
    x = rand(2, 4, 5)
    inputs = [x] if k is None else [x, np.array(k, I64)]
    check("Trilu", inputs, constant=[1], opset=14, upper=upper)
    if k is not None:
        check_dynamic("Trilu", inputs, opset=14, upper=upper)
    if k in (None, 1):
        check_gradients("Trilu", inputs, constant=[1], opset=14, upper=upper)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    indices = np.array([[0, 3, -1], [2, 7, -4]], I64)
    depth, values = np.array(4, I64), np.array([0.5, 2.0], np.float32)
    check("OneHot", [indices, depth, values], constant=[1], opset=11, axis=axis)
    check_dynamic("OneHot", [indices.astype(np.float32), depth, values], opset=11, axis=axis)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction, axis):
    data = rand(3, 4)
    indices = np.array([[0, 1, -1], [2, 0, 1]], I64) if axis != 0 else np.array([[0, 1, 2], [-1, 2, 0]], I64)
    updates = rand(2, 3, seed=5)
    opset = 18 if reduction in ("max", "min") else 16
    check("ScatterElements", [data, indices, updates], constant=[1], opset=opset, axis=axis, reduction=reduction)
    if reduction in ("none", "add"):
        check_gradients(
            "ScatterElements", [data, indices, updates], constant=[1], opset=opset, axis=axis, reduction=reduction
        )


def test_scatter_elements_opset_11():
    check("ScatterElements", [rand(3, 3), np.array([[1, 0, 2]], I64), rand(1, 3, seed=2)], opset=11, axis=0)


@pytest.mark.parametrize("reduction, opset", [("none", 11), ("add", 16), ("mul", 16), ("max", 18), ("min", 18)])
@pytest.mark.parametrize("indices", [np.array([[1], [-4]], I64), np.array([[0, 2], [3, 1], [1, 1]], I64)])
def test_scatter_nd(reduction, opset, indices):
    data = rand(4, 3, 2)
    updates = rand(*indices.shape[:-1], *data.shape[indices.shape[-1] :], seed=4)
    reference = "ort" if (indices < 0).any() else "onnx"  # onnx.reference does not wrap negative indices
    attrs = {} if opset < 16 else {"reduction": reduction}
    check("ScatterND", [data, indices, updates], constant=[1], opset=opset, reference=reference, **attrs)
    if reduction in ("none", "add"):
        check_gradients("ScatterND", [data, indices, updates], constant=[1], opset=opset, **attrs)
