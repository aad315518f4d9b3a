"""Reduce* for opsets 11 (axes attribute), 13 (ReduceSum axes input) and 18/21 (all axes inputs)."""

import numpy as np
import pytest

from tests.helpers.adapter_harness import check, check_dynamic, check_gradients, rand

OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]
AXES = [None, [1], [-1, 0]]


def _positive(x):
    return np.abs(x) + 0.5


def _axes_as_input(op: str, opset: int) -> bool:
    return opset >= (13 if op == "ReduceSum" else 18)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(op, opset, axes, keepdims):
    x = _positive(rand(2, 3, 4))
    if not _axes_as_input(op, opset):
        check(op, [x], opset=opset, atol=1e-5, keepdims=keepdims, **({} if axes is None else {"axes": axes}))
        return
    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
    check(op, inputs, constant=[1], opset=opset, atol=1e-5, keepdims=keepdims)
    if axes is not None:
        check_dynamic(op, inputs, opset=opset, atol=1e-5, keepdims=keepdims)


@pytest.mark.parametrize("op", OPS)
def test_noop_with_empty_axes(op):
    x = _positive(rand(2, 3))
    check(op, [x], opset=18, atol=1e-5, noop_with_empty_axes=1)
    check(op, [x, np.array([], np.int64)], constant=[1], opset=21, atol=1e-5, noop_with_empty_axes=1)
    check(op, [x, np.array([], np.int64)], constant=[1], opset=18, atol=1e-5)
    check(op, [x, np.array([0, -1], np.int64)], constant=[1], opset=21, atol=1e-5, keepdims=0)
    check_dynamic(op, [x, np.array([], np.int64)], opset=18, atol=1e-5, noop_with_empty_axes=1)


@pytest.mark.parametrize("op", OPS)
def test_reduce_gradient(op):
    check_gradients(op, [_positive(rand(2, 3)), np.array([1], np.int64)], constant=[1], opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceSumSquare"])
def test_reduce_integers(op):
    check(op, [rand(2, 3, 4, dtype=np.int64)], opset=11, axes=[0, 2])
