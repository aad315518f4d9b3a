"""Slice, Gather, Split, Concat, Where."""

import numpy as np
import pytest

from tests.helpers.adapter_harness import INT64_MAX, INT64_MIN, check, check_dynamic, check_gradients, rand

I64 = np.int64

SLICES = [  # starts, ends, axes, steps
    ([1], [3], [0], [1]),
    ([0, 1], [INT64_MAX, -1], [1, 2], None),
    ([-1], [INT64_MIN], [1], [-1]),
    ([4], [0], [2], [-2]),
    ([10, -10], [-10, 10], [0, 2], [-1, 1]),
    ([0], [3], None, None),
    ([1, 0], [100, 5], [-1, -2], [2, 3]),
    ([2], [1], [0], [1]),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
@pytest.mark.parametrize("opset", [13, 21])
def test_slice(starts, ends, axes, steps, opset):
    inputs = [rand(3, 4, 5), np.array(starts, I64), np.array(ends, I64)]
    inputs += [None if axes is None else np.array(axes, I64), None if steps is None else np.array(steps, I64)]
    while inputs[-1] is None:
        inputs.pop()
    check("Slice", inputs, constant=[1, 2, 3, 4], opset=opset)
    check_dynamic("Slice", inputs, opset=opset)


def test_slice_opset_9_attributes():
    check("Slice", [rand(3, 4, 5)], opset=9, starts=[1, -3], ends=[INT64_MAX, 4], axes=[0, 2])


def test_slice_gradient_with_negative_step():
    inputs = [
        rand(4, 5),
        np.array([-1, 1], I64),
        np.array([INT64_MIN, 5], I64),
        np.array([0, 1], I64),
        np.array([-2, 2], I64),
    ]
    check_gradients("Slice", inputs, constant=[1, 2, 3, 4])


@pytest.mark.parametrize(
    "indices",
    [
        np.array(1, I64),
        np.array(-1, I64),
        np.array([2, 0, -1], I64),
        np.array([1, 2], I64),
        np.array([[0, 1], [-2, 2]], I64),
    ],
)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(indices, axis):
    x = rand(3, 4, 3)
    check("Gather", [x, indices], constant=[1], opset=13, axis=axis)
    check_dynamic("Gather", [x, indices], opset=13, axis=axis)
    check_gradients("Gather", [x, indices], constant=[1], axis=axis)


def test_gather_embedding_and_int32_indices():
    weight, ids = rand(10, 4), np.array([[1, 9, -1], [0, 0, 3]], np.int32)
    check("Gather", [weight, ids], opset=13)
    check_gradients("Gather", [weight, ids])


@pytest.mark.parametrize("opset, split", [(11, [1, 4]), (13, [2, 3]), (18, [3, 1, 1])])
def test_split_sizes(opset, split):
    x = rand(5, 3)
    if opset < 13:
        check("Split", [x], outputs=len(split), opset=opset, split=split)
        return
    check("Split", [x, np.array(split, I64)], constant=[1], outputs=len(split), opset=opset)
    check_dynamic("Split", [x, np.array(split, I64)], outputs=len(split), opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_split_equal_by_output_count(opset):
    check("Split", [rand(2, 6)], outputs=3, opset=opset, axis=-1)


@pytest.mark.parametrize("size, parts", [(7, 3), (6, 3), (4, 3)])
def test_split_num_outputs(size, parts):
    check("Split", [rand(size, 2)], outputs=parts, opset=18, num_outputs=parts)


def test_split_gradient():
    check_gradients("Split", [rand(5, 2), np.array([2, 3], I64)], constant=[1])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3], [2, 3], [2, 3]]
    shapes = [[s if i != axis % 2 else s + k for i, s in enumerate(shape)] for k, shape in enumerate(shapes)]
    inputs = [rand(*shape, seed=k) for k, shape in enumerate(shapes)]
    check("Concat", inputs, opset=13, axis=axis)
    check("Concat", inputs, constant=[1], opset=13, axis=axis)
    check_gradients("Concat", inputs, axis=axis)


def test_concat_shape_vectors():
    check("Concat", [np.array([1, 2], I64), np.array([3], I64)], opset=13, axis=0)


def test_where():
    condition = rand(3, 4) > 0
    check("Where", [condition, rand(3, 4), rand(4)], opset=16)
    check("Where", [condition, np.array(-np.inf, np.float32), rand(1, 4)], constant=[1], opset=9)
    check_gradients("Where", [condition, rand(3, 4), rand(4)])
