"""Gemm, MatMul, MaxPool (with Indices), AveragePool, GlobalAveragePool, GlobalMaxPool."""

import pytest

from tests.helpers.adapter_harness import check, check_gradients, rand


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 1), (3, 5), ()])
def test_gemm(trans_a, trans_b, c_shape):
    a = rand(4, 3) if trans_a else rand(3, 4)
    b = rand(5, 4, seed=1) if trans_b else rand(4, 5, seed=1)
    inputs = [a, b] if c_shape is None else [a, b, rand(*c_shape, seed=2)]
    check("Gemm", inputs, opset=13, atol=1e-5, transA=trans_a, transB=trans_b)
    check("Gemm", inputs, opset=11, atol=1e-5, transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)
    check_gradients("Gemm", inputs, transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)


def test_gemm_linear_form_and_beta_zero():
    check("Gemm", [rand(3, 4), rand(5, 4), rand(5)], opset=13, atol=1e-5, transB=1)
    check("Gemm", [rand(3, 4), rand(5, 4), rand(5)], opset=13, atol=1e-5, transB=1, beta=0.0)
    check("Gemm", [rand(3, 4), rand(5, 4)], opset=13, atol=1e-5, transB=1)


@pytest.mark.parametrize("shapes", [((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(shapes):
    inputs = [rand(*shapes[0]), rand(*shapes[1], seed=1)]
    check("MatMul", inputs, opset=13, atol=1e-5)
    check_gradients("MatMul", inputs)


MAX_POOLS = [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 2, 0]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [1, 1]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]},
]


@pytest.mark.parametrize("attrs", MAX_POOLS)
def test_max_pool_2d(attrs):
    x = rand(2, 3, 7, 6)
    check("MaxPool", [x], opset=12, **attrs)
    check("MaxPool", [x], outputs=2, opset=12, reference="ort", **attrs)  # onnx.reference's Indices are wrong
    check_gradients("MaxPool", [x[:1, :1]], opset=12, **attrs)


def test_max_pool_indices_column_major_1d_3d():
    check("MaxPool", [rand(2, 3, 5, 4)], outputs=2, opset=12, reference="ort", kernel_shape=[2, 2], storage_order=1)
    check("MaxPool", [rand(2, 3, 9)], outputs=2, opset=12, reference="ort", kernel_shape=[3], strides=[2], pads=[1, 1])
    check("MaxPool", [rand(1, 2, 4, 5, 3)], outputs=2, opset=12, reference="ort", kernel_shape=[2, 2, 2])


AVERAGE_POOLS = [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0]},
    {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0], "count_include_pad": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
]


@pytest.mark.parametrize("attrs", AVERAGE_POOLS)
@pytest.mark.parametrize("opset", [11, 19])
def test_average_pool(attrs, opset):
    check("AveragePool", [rand(2, 3, 7, 6)], opset=opset, atol=1e-5, **attrs)
    check_gradients("AveragePool", [rand(1, 1, 7, 6)], opset=opset, **attrs)


@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_dilations(include_pad):
    attrs = {"kernel_shape": [2, 3], "dilations": [2, 1], "pads": [1, 0, 0, 1], "count_include_pad": include_pad}
    check("AveragePool", [rand(2, 3, 7, 6)], opset=19, atol=1e-5, **attrs)
    check("AveragePool", [rand(2, 3, 9)], opset=19, atol=1e-5, kernel_shape=[3], dilations=[3], strides=[2])


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_global_pools(op, shape):
    check(op, [rand(*shape)], opset=13, atol=1e-6, reference="ort")  # onnx.reference drops dims here
    check_gradients(op, [rand(*shape)])
