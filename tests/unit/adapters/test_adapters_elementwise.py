"""Arithmetic, unary math, comparisons, logic, variadic ops, Clip."""

import numpy as np
import pytest

from tests.helpers.adapter_harness import check, check_dynamic, check_gradients, convert_model, one_node_model, rand

BINARY = ["Add", "Sub", "Mul", "Div"]


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("opset", [7, 13, 14])
def test_binary_broadcasting(op, opset):
    check(op, [rand(2, 3, 4), rand(3, 1)], opset=opset)
    check_gradients(op, [rand(2, 3, 4), rand(3, 1) + 3.0])


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("position", [0, 1])
@pytest.mark.parametrize("constant_shape", [(), (1,), (1, 1, 1)])
def test_binary_with_scalar_constant(op, position, constant_shape):
    constant = np.full(constant_shape, 1.75, np.float32)
    inputs = [rand(2, 3), constant] if position == 1 else [constant, rand(2, 3)]
    check(op, inputs, constant=[position], opset=14)


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_arithmetic(op, dtype):
    a = np.array([[7, -7, 5, -5, 0, 9]], dtype)
    b = np.array([[2, 2, -3, -3, 4, 10]], dtype)
    check(op, [a, b], opset=14)
    check(op, [a, np.array(-3, dtype)], constant=[1], opset=14)
    check(op, [np.array(7, dtype).reshape(1, 1), b], constant=[0], opset=14)


@pytest.mark.parametrize(
    "base, exponent, constant",
    [
        (rand(2, 3), rand(2, 3), ()),
        (np.abs(rand(2, 3)) + 0.5, np.array(2.0, np.float32), (1,)),
        (rand(2, 3), np.array(3, np.int64), (1,)),
        (np.array([1, 2, 3], np.int64), np.array([2, 0, 1], np.int64), ()),
        (np.array([4, 9, 2], np.int32), np.array(0.5, np.float32), (1,)),
    ],
)
def test_pow(base, exponent, constant):
    if base.dtype == np.float32 and exponent.dtype == np.float32 and not constant:
        base = np.abs(base) + 0.5
    check("Pow", [base, exponent], constant=constant, opset=15, atol=1e-5)


def test_pow_gradient():
    check_gradients("Pow", [np.abs(rand(2, 3)) + 0.5, rand(2, 3)])


UNARY = [
    "Neg",
    "Abs",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Erf",
    "Tanh",
    "Sigmoid",
    "Relu",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Sin",
    "Cos",
    "Softplus",
    "Softsign",
]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    x = rand(3, 4) * 2
    if op in ("Sqrt", "Log"):
        x = np.abs(x) + 0.1
    check(op, [x], opset=13, atol=1e-5)
    if op not in ("Floor", "Ceil", "Round", "Sign"):
        check_gradients(op, [x if op not in ("Reciprocal",) else np.abs(x) + 0.5])


def test_round_half_to_even():
    check("Round", [np.array([0.5, 1.5, 2.5, -0.5, -1.5], np.float32)], opset=11)


@pytest.mark.parametrize(
    "op, attrs", [("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.5}), ("Mish", {})]
)
def test_activations(op, attrs):
    opset = 18 if op == "Mish" else 16
    check(op, [rand(3, 4)], opset=opset, atol=1e-5, **attrs)
    check_gradients(op, [rand(3, 4)], opset=opset, **attrs)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparisons(op, dtype):
    a, b = rand(3, 4, dtype=dtype), rand(4, dtype=dtype, seed=1)
    a[0, :] = b
    opset = 16 if op in ("LessOrEqual", "GreaterOrEqual") else 13
    check(op, [a, b], opset=opset)
    check(op, [a, np.array(0, dtype)], constant=[1], opset=opset)
    check(op, [np.array(0, dtype), a], constant=[0], opset=opset)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check(op, [rand(3, 4) > 0, rand(4, seed=1) > 0], opset=7)


def test_not():
    check("Not", [rand(3, 4) > 0], opset=1)


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_variadic(op, count):
    inputs = [rand(2, 3, seed=0), rand(3, seed=1), rand(2, 1, seed=2)][:count]
    check(op, inputs, opset=13)
    check_gradients(op, inputs)


def test_max_of_integers():
    check("Max", [rand(4, dtype=np.int32), rand(4, dtype=np.int32, seed=3)], opset=13)


@pytest.mark.parametrize("bounds", [(-0.5, 0.5), (None, 0.5), (-0.5, None), (None, None), (1.0, -1.0)])
def test_clip(bounds):
    low, high = bounds
    x = rand(3, 4)
    attrs = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
    check("Clip", [x], opset=6, **attrs)
    inputs = [
        x,
        None if low is None else np.array(low, np.float32),
        None if high is None else np.array(high, np.float32),
    ]
    while inputs[-1] is None and len(inputs) > 1:
        inputs.pop()
    check("Clip", inputs, constant=[1, 2], opset=13)
    check_dynamic("Clip", inputs, opset=13)


def test_clip_integers_and_gradient():
    check(
        "Clip", [rand(3, 4, dtype=np.int64), np.array(-2, np.int64), np.array(3, np.int64)], constant=[1, 2], opset=12
    )
    check_gradients("Clip", [rand(3, 4), np.array(-0.5), np.array(0.5)], constant=[1, 2], opset=13)


def test_scalar_constant_does_not_widen_the_result():
    # A (1, 1, 1) constant added to a 2-D input widens it to 3-D: it must not be baked as a number.
    model = one_node_model("Add", [rand(2, 3), np.ones((1, 1, 1), np.float32)], constant=[1], opset=14)
    gm, tensors = convert_model(model, [rand(2, 3), None])
    assert gm(*tensors)[0].shape == (1, 2, 3)


@pytest.mark.parametrize("negative, positive", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_is_inf_is_nan(negative, positive):
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0], np.float32)
    check("IsInf", [x], opset=20, detect_negative=negative, detect_positive=positive)
    check("IsNaN", [x], opset=20)
