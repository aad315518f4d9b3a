"""User inputs as numpy arrays: a torch view of the usual array, a copy of a read-only or reversed one, and a
clear error naming the input for what torch cannot take."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ort_torch_train.api.ortvalue import from_tensors, to_tensors
from ort_torch_train.errors import InputTypeError


def test_a_writeable_array_is_shared_and_the_output_kind_is_numpy():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tensor,), kind = to_tensors([array], ["x"])
    assert kind == "numpy"
    array[0, 0] = 42.0
    assert float(tensor[0, 0]) == 42.0  # a view, no copy


def test_read_only_and_reversed_arrays_are_copied():
    frozen = np.arange(4, dtype=np.int64)
    frozen.flags.writeable = False
    reversed_view = np.arange(5, dtype=np.float32)[::-1]
    (first, second), _ = to_tensors([frozen, reversed_view], ["ids", "x"])
    assert first.tolist() == [0, 1, 2, 3] and second.tolist() == [4.0, 3.0, 2.0, 1.0, 0.0]


@pytest.mark.parametrize("array", [np.array(["a", "b"]), np.array([object(), 1], dtype=object)])
def test_a_non_numeric_array_names_its_input(array):
    with pytest.raises(InputTypeError, match=r"input 'labels': numeric array expected, got dtype"):
        to_tensors([np.zeros(2, np.float32), array], ["x", "labels"])


def test_mixed_kinds_answer_in_numpy_and_a_cpu_output_comes_back_as_its_view():
    tensors, kind = to_tensors([np.zeros(2, np.float32), torch.ones(2)], ["x", "y"])
    assert kind == "numpy"
    output = torch.tensor([3.5, 2.0])
    converted = from_tensors([output], kind)
    assert isinstance(converted, np.ndarray) and converted.tolist() == [3.5, 2.0]
    output.fill_(1.0)
    assert converted.tolist() == [1.0, 1.0]  # the output's own memory: no copy on CPU


@pytest.mark.parametrize(
    "value",
    [torch.tensor(3.5), torch.tensor(float("-inf")), torch.tensor(-0.0), torch.tensor(2**62 + 1), torch.tensor(True)]
    + [torch.tensor(0.1, dtype=dtype) for dtype in (torch.float16, torch.float64)],
)
def test_a_scalar_output_comes_back_as_a_zero_dim_array_of_its_bytes(value):
    converted = from_tensors([value], "numpy")
    expected = value.numpy()
    assert isinstance(converted, np.ndarray) and converted.shape == () and converted.dtype == expected.dtype
    assert converted.tobytes() == expected.tobytes() and converted.flags.writeable
