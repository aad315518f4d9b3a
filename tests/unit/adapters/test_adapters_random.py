"""RandomUniformLike and Bernoulli: shapes, dtypes and ranges (the values are torch's draws, not numpy's)."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto

from tests.helpers.adapter_harness import convert_model, one_node_model


def _draw(op_type: str, x: np.ndarray, training: bool = False, **attrs):
    gm, tensors = convert_model(one_node_model(op_type, [x], opset=22, **attrs), [x], training=training)
    return gm, tensors


def test_random_uniform_like_draws_in_range_with_the_asked_dtype_and_fresh_values_per_call():
    gm, tensors = _draw(
        "RandomUniformLike", np.zeros((40, 50), np.float32), low=-2.0, high=3.0, dtype=TensorProto.DOUBLE
    )
    (first,), (second,) = gm(*tensors), gm(*tensors)
    assert first.shape == (40, 50) and first.dtype == torch.float64
    assert first.min() >= -2.0 and first.max() < 3.0 and first.std() > 1.0
    assert not torch.equal(first, second)


def test_random_uniform_like_with_a_seed_repeats_across_conversions():
    draws = [
        gm(*tensors)[0]
        for gm, tensors in (_draw("RandomUniformLike", np.zeros(8, np.float32), seed=5.0) for _ in range(2))
    ]
    torch.testing.assert_close(draws[0], draws[1])
    assert draws[0].dtype == torch.float32


def test_bernoulli_draws_zeros_and_ones_at_the_given_probabilities():
    probabilities = np.repeat(np.array([0.0, 0.3, 1.0], np.float32), 4000).reshape(3, 4000)
    gm, tensors = _draw("Bernoulli", probabilities, dtype=TensorProto.INT64)
    (draw,) = gm(*tensors)
    assert draw.shape == (3, 4000) and draw.dtype == torch.int64
    assert set(draw.unique().tolist()) <= {0, 1}
    assert draw[0].sum() == 0 and draw[2].sum() == 4000
    assert abs(draw[1].double().mean().item() - 0.3) < 0.03
