"""float64 gradchecks of the differentiable converters added for the conformance suite."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.adapter_harness import check_gradients, rand

X = rand(2, 3, 4)
UNIT = np.tanh(X) * 0.9  # inside (-1, 1)


@pytest.mark.parametrize(
    "op_type, inputs, constant, opset, attrs",
    [
        ("HardSwish", [X], (), 14, {}),
        ("HardSigmoid", [X], (), 17, {"alpha": 0.3}),
        ("Selu", [X], (), 17, {}),
        ("Celu", [X], (), 17, {"alpha": 2.0}),
        ("Shrink", [X], (), 17, {"lambd": 0.1, "bias": 0.2}),
        ("Tan", [UNIT], (), 17, {}),
        ("Asin", [UNIT], (), 17, {}),
        ("Acosh", [np.abs(X) + 1.5], (), 17, {}),
        ("Atanh", [UNIT], (), 17, {}),
        ("Sinh", [X], (), 17, {}),
        ("CumSum", [X, np.array(1, dtype=np.int64)], (1,), 17, {"exclusive": 1, "reverse": 1}),
        ("CumSum", [X, np.array(-1, dtype=np.int64)], (), 17, {}),
        ("Einsum", [X, rand(4, 5)], (), 17, {"equation": "bij,jk->bik"}),
        ("TopK", [X, np.array([2], dtype=np.int64)], (1,), 17, {"axis": 1}),
        ("InstanceNormalization", [X, rand(3) + 1, rand(3)], (), 17, {}),
        ("LpNormalization", [X], (), 17, {"axis": 1, "p": 2}),
        ("MeanVarianceNormalization", [rand(2, 3, 4, 5)], (), 17, {}),
        ("DepthToSpace", [rand(1, 8, 2, 3)], (), 17, {"blocksize": 2, "mode": "CRD"}),
        ("ReverseSequence", [X, np.array([1, 3], dtype=np.int64)], (), 17, {"batch_axis": 0, "time_axis": 1}),
        ("Hardmax", [X], (), 17, {}),
        ("Det", [rand(2, 3, 3)], (), 17, {}),
        (
            "LpPool",
            [rand(1, 2, 5, 5)],
            (),
            18,
            {"kernel_shape": [2, 3], "p": 3, "pads": [1, 0, 0, 1], "strides": [2, 1]},
        ),
        ("GridSample", [rand(1, 2, 3, 4), UNIT.reshape(1, 3, 4, 2)], (), 20, {"mode": "linear"}),
        ("GridSample", [rand(1, 1, 3, 4), UNIT.reshape(1, 3, 4, 2)], (), 20, {"mode": "cubic", "align_corners": 1}),
        ("AffineGrid", [rand(2, 2, 3), np.array([2, 1, 3, 4], dtype=np.int64)], (1,), 20, {}),
        (
            "Col2Im",
            [rand(1, 8, 8), np.array([3, 4], dtype=np.int64), np.array([2, 2], dtype=np.int64)],
            (1, 2),
            18,
            {"pads": [0, 1, 0, 0]},
        ),
        ("CenterCropPad", [rand(5, 2, 3), np.array([3, 4], dtype=np.int64)], (1,), 18, {"axes": [0, 1]}),
        ("Upsample", [rand(1, 1, 2, 3), np.array([1, 1, 2, 1.5], dtype=np.float32)], (1,), 9, {"mode": "linear"}),
        ("DFT", [rand(2, 6, 1)], (), 17, {"axis": 1, "onesided": 1}),
        ("DFT", [rand(2, 6, 2)], (), 17, {"axis": 1, "inverse": 1}),
        ("STFT", [rand(1, 12, 1), np.array(3, dtype=np.int64), np.hanning(4)], (1,), 17, {}),
        ("SwiGLU", [X, rand(2, 3, 4, seed=1)], (), 28, {"alpha": 1.5}),
        (
            "TensorScatter",
            [rand(2, 5, 3), rand(2, 2, 3, seed=1), np.array([1, 4], dtype=np.int64)],
            (2,),
            24,
            {"mode": "circular"},
        ),
        (
            "LinearAttention",
            [
                rand(1, 3, 4),
                rand(1, 3, 2),
                rand(1, 3, 3),
                rand(1, 1, 2, 3),
                -np.abs(rand(1, 3, 1)),
                np.abs(rand(1, 3, 1, seed=2)),
            ],
            (),
            27,
            {"q_num_heads": 2, "kv_num_heads": 1},
        ),
        ("CausalConvWithState", [rand(1, 2, 5), rand(2, 1, 3), rand(2), rand(1, 2, 2)], (), 27, {"activation": "silu"}),
        (
            "DeformConv",
            [rand(1, 2, 4, 4), rand(2, 1, 2, 2), 0.3 * rand(1, 8, 3, 3), rand(2), rand(1, 4, 3, 3, seed=3)],
            (),
            19,
            {"kernel_shape": [2, 2], "group": 2},
        ),
        (
            "RoiAlign",
            [rand(1, 2, 5, 5), np.array([[0.5, 0.3, 3.2, 4.1]], np.float32), np.array([0], np.int64)],
            (1, 2),
            16,
            {"output_height": 2, "output_width": 3, "sampling_ratio": 2},
        ),
        ("GatherND", [rand(2, 3, 4), np.array([[[1], [0]], [[2], [-1]]], np.int64)], (1,), 13, {"batch_dims": 1}),
        (
            "Resize",
            [rand(1, 1, 3, 4), None, np.array([1, 1, 1.5, 0.6], np.float32)],
            (2,),
            19,
            {"mode": "cubic", "antialias": 1, "exclude_outside": 1},
        ),
        ("Pad", [X, np.array([0, 1, 0, 0, 2, 1], np.int64), np.array(0.5)], (1,), 18, {}),
        (
            "NegativeLogLikelihoodLoss",
            [rand(3, 4), np.array([1, 3, 0], np.int64), np.abs(rand(4)) + 0.5],
            (1,),
            13,
            {"ignore_index": 0},
        ),
        (
            "MaxUnpool",
            [rand(1, 1, 2, 2), np.array([[[[0, 3], [9, 14]]]], dtype=np.int64)],
            (1,),
            22,
            {"kernel_shape": [2, 2], "strides": [2, 2]},
        ),
    ],
)
def test_gradients(op_type, inputs, constant, opset, attrs):
    check_gradients(op_type, inputs, constant=constant, opset=opset, **attrs)
