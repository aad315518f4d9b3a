"""com.microsoft FusedGemm (ORT's fusion of a Gemm and its activation, found in ORT-format models) against
onnxruntime's own kernel, for each activation it may carry, with and without C and transposes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ort_torch_train.errors import ModelError
from tests.helpers.adapter_harness import assert_close, convert_model, one_node_model, rand, reference_outputs

ACTIVATIONS = {
    "Relu": {},
    "Tanh": {},
    "Sigmoid": {},
    "LeakyRelu": {"activation_alpha": 0.2},
    "Elu": {"activation_alpha": 0.7},
    "HardSigmoid": {"activation_alpha": 0.3, "activation_beta": 0.4},
}


def fused_gemm_model(inputs: list[np.ndarray], **attrs: object) -> onnx.ModelProto:
    model = one_node_model("FusedGemm", inputs, constant=(1, 2), domain="com.microsoft", opset=1, **attrs)
    model.opset_import.append(onnx.helper.make_opsetid("", 17))
    return model


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("layout", ["linear", "transposed_a", "scaled_without_c"])
def test_fused_gemm_matches_onnxruntime(activation: str, layout: str) -> None:
    a, b, c = rand(4, 6, seed=1) * 2, rand(5, 6, seed=2), rand(5, seed=3)
    attrs: dict[str, object] = {"transB": 1, "activation": activation, **ACTIVATIONS[activation]}
    inputs: list[np.ndarray] = [a, b, c]
    if layout == "transposed_a":
        inputs[0], attrs["transA"] = np.ascontiguousarray(a.T), 1
    elif layout == "scaled_without_c":
        inputs, attrs["alpha"] = [a, b], 0.5
    model = fused_gemm_model(inputs, **attrs)
    module, tensors = convert_model(model, inputs)
    assert_close([t.numpy() for t in module(*tensors)], reference_outputs(model, inputs, "ort"), atol=1e-6)


def test_an_activation_fused_gemm_cannot_run_is_refused_naming_it() -> None:
    inputs = [rand(4, 6), rand(5, 6), rand(5)]
    model = fused_gemm_model(inputs, transB=1, activation="Softsign")
    with pytest.raises(ModelError, match="FusedGemm with activation 'Softsign' is not supported"):
        convert_model(model, inputs)
