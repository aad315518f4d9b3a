"""Empty past key/value inputs for LLM graphs whose training inputs are ids, mask and labels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from ort_torch_train.api.kv_cache import with_empty_past
from ort_torch_train.errors import InputError
from ort_torch_train.training.input_checks import InputDeclaration

DECLARED = (
    InputDeclaration("input_ids", onnx.TensorProto.INT64, ("batch", "seq")),
    InputDeclaration("attention_mask", onnx.TensorProto.INT64, ("batch", "total")),
    InputDeclaration("past_key_values.0.key", onnx.TensorProto.FLOAT, ("batch", 2, "past", 16)),
    InputDeclaration("past_key_values.0.value", onnx.TensorProto.FLOAT16, ("batch", 2, "past", "head")),
    InputDeclaration("labels", onnx.TensorProto.INT64, ("batch", "seq")),
)


def test_left_out_past_inputs_are_empty_tensors_of_the_declared_type():
    ids = np.zeros((3, 5), np.int64)
    filled = with_empty_past((ids, ids, ids), DECLARED)
    assert len(filled) == 5 and filled[0] is ids and filled[4] is ids
    assert filled[2].shape == (3, 2, 0, 16) and filled[2].dtype == torch.float32
    assert filled[3].shape == (3, 2, 0, 0) and filled[3].dtype == torch.float16


def test_every_input_given_or_another_count_is_left_alone():
    ids = np.zeros((3, 5), np.int64)
    every = (ids,) * 5
    assert with_empty_past(every, DECLARED) is every
    assert with_empty_past((ids, ids), DECLARED) == (ids, ids)  # the Module names what is missing


def test_a_first_input_that_is_not_a_batch_is_refused_naming_the_past_inputs():
    scalar = np.int64(3)
    with pytest.raises(
        InputError, match=r"past_key_values\.\*: .*expected a batch \(input_ids\), got int64 of shape \(\)"
    ):
        with_empty_past((scalar, scalar, scalar), DECLARED)
