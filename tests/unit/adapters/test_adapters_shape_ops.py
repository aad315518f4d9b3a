"""Reshape, Squeeze, Unsqueeze, Flatten, Expand, Tile, Transpose, Identity, Shape, Size."""

import numpy as np
import pytest

from tests.helpers.adapter_harness import check, check_dynamic, check_gradients, convert_model, one_node_model, rand

I64 = np.int64


@pytest.mark.parametrize("opset", [13, 14, 19, 21])
@pytest.mark.parametrize("shape", [[4, 6], [0, -1], [2, 0, 3], [-1], [1, 2, 12]])
def test_reshape(opset, shape):
    check("Reshape", [rand(2, 4, 3), np.array(shape, I64)], constant=[1], opset=opset)
    check_dynamic("Reshape", [rand(2, 4, 3), np.array(shape, I64)], opset=opset)


@pytest.mark.parametrize("opset", [14, 21])
def test_reshape_allowzero(opset):
    check("Reshape", [rand(0, 3), np.array([3, 0], I64)], constant=[1], opset=opset, allowzero=1)
    check_dynamic("Reshape", [rand(0, 3), np.array([3, 0], I64)], opset=opset, allowzero=1)
    check("Reshape", [rand(2, 3), np.array([3, -1], I64)], constant=[1], opset=opset, allowzero=1)


def test_reshape_opset_1_attribute():  # the reference evaluator has no Reshape-1
    x = rand(2, 6)
    gm, tensors = convert_model(one_node_model("Reshape", [x], opset=1, shape=[3, 4]), [x])
    np.testing.assert_array_equal(gm(*tensors)[0].numpy(), x.reshape(3, 4))


def test_reshape_gradient():
    check_gradients("Reshape", [rand(2, 3), np.array([3, 2], I64)], constant=[1])


@pytest.mark.parametrize("axes", [None, [0], [-1], [0, 3]])
def test_squeeze(axes):
    x = rand(1, 3, 2, 1)
    check("Squeeze", [x], opset=11, **({} if axes is None else {"axes": axes}))
    inputs = [x] if axes is None else [x, np.array(axes, I64)]
    check("Squeeze", inputs, constant=[1], opset=13)
    if axes is not None:
        check_dynamic("Squeeze", inputs, opset=21)


@pytest.mark.parametrize("axes", [[0], [-1], [0, 3], [1, 2]])
def test_unsqueeze(axes):
    x = rand(3, 2)
    check("Unsqueeze", [x], opset=11, axes=axes)
    check("Unsqueeze", [x, np.array(axes, I64)], constant=[1], opset=13)
    check_dynamic("Unsqueeze", [x, np.array(axes, I64)], opset=21)


def test_unsqueeze_negative_axes_count_in_the_output_rank():
    # The reference evaluator inserts one axis at a time; the spec (and onnxruntime) give (1, 1, 3, 2, 1).
    x = rand(3, 2)
    model = one_node_model("Unsqueeze", [x, np.array([1, -1, 0], I64)], constant=[1], opset=13)
    gm, tensors = convert_model(model, [x])
    np.testing.assert_array_equal(gm(*tensors)[0].numpy(), x.reshape(1, 1, 3, 2, 1))


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
@pytest.mark.parametrize("opset", [11, 13, 21])
def test_flatten(axis, opset):
    check("Flatten", [rand(2, 3, 4)], opset=opset, axis=axis)


@pytest.mark.parametrize("x_shape, shape", [((3, 1), [2, 3, 4]), ((1, 4), [3, 1]), ((2, 1, 4), [1]), ((4,), [2, 1, 4])])
def test_expand(x_shape, shape):
    check("Expand", [rand(*x_shape), np.array(shape, I64)], constant=[1], opset=13)
    check_dynamic("Expand", [rand(*x_shape), np.array(shape, I64)], opset=13)
    check_gradients("Expand", [rand(*x_shape), np.array(shape, I64)], constant=[1])


def test_tile():
    check("Tile", [rand(2, 3), np.array([2, 3], I64)], constant=[1], opset=13)
    check_dynamic("Tile", [rand(2, 3, dtype=np.int32), np.array([1, 2], I64)], opset=13)
    check_gradients("Tile", [rand(2, 3), np.array([2, 1], I64)], constant=[1])


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
@pytest.mark.parametrize("opset", [13, 21])
def test_transpose(perm, opset):
    check("Transpose", [rand(2, 3, 4)], opset=opset, **({} if perm is None else {"perm": perm}))


def test_identity_and_size():
    check("Identity", [rand(2, 3)], opset=21)
    check_dynamic("Identity", [rand(2, 3)], opset=21)
    check_dynamic("Size", [rand(2, 3)], opset=21)


@pytest.mark.parametrize("bounds", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 5}])
def test_shape(bounds):
    check_dynamic("Shape", [rand(2, 3, 4)], opset=15, **bounds)
    check("Shape", [rand(2, 3, 4)], opset=19, **bounds)


@pytest.mark.compile
def test_a_compiled_expand_to_a_size_read_from_data_needs_no_guard_on_it():
    """Expand to a shape tensor computed from a NonZero's count (the tokens routed to one expert): the
    size read back is declared a size where it is formed, so broadcasting decides nothing on its value;
    one graph serves every count, none included."""
    import torch
    from torch._dynamo.utils import counters

    from ort_torch_train.adapters.shape_ops import expand_dynamic

    def routed(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        shape = torch.tensor([torch.nonzero(mask).shape[0], 1]) * torch.tensor([1, 3])  # a shape tensor in the graph
        return expand_dynamic(x, shape) * 2

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(routed, backend="eager", fullgraph=True, dynamic=False)
    for mask in ([1, 0, 1], [0, 0, 0], [1, 1, 1]):
        mask = torch.tensor(mask, dtype=torch.bool)
        assert torch.equal(compiled(torch.ones(1, 1), mask), routed(torch.ones(1, 1), mask))
    assert compiled(torch.ones(1, 1), torch.tensor([0, 0, 0], dtype=torch.bool)).shape == (0, 3)
    assert counters["stats"]["unique_graphs"] == 1
