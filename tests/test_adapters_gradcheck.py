"""float64 gradchecks of the differentiable converters added for the conformance suite."""

from __future__ import annotations

import numpy as np
import pytest

from adapter_harness import check_gradients, rand

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
    ],
)
def test_gradients(op_type, inputs, constant, opset, attrs):
    check_gradients(op_type, inputs, constant=constant, opset=opset, **attrs)
