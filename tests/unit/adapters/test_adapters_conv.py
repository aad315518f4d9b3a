"""Conv: the converted node against the ONNX reference, and its compiled form (a sum over kernel taps
for small convs, under torch.compile and in a package's step traced by make_fx) against the eager one,
values and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_train.adapters.conv import Conv
from tests.helpers.adapter_harness import check, convert_model, one_node_model, rand

CASES = {
    "plain": ((8, 1, 12, 12), (4, 1, 3, 3), {}),
    "stride_dilation": ((4, 3, 13, 11), (5, 3, 3, 2), {"strides": [2, 1], "dilations": [1, 2]}),
    "asymmetric_pads": ((4, 2, 9, 9), (3, 2, 3, 3), {"pads": [1, 0, 2, 1]}),
    "same_upper": ((2, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "two_by_two": ((2, 3, 8, 8), (4, 3, 2, 2), {"strides": [2, 2]}),
}


def _model(case: str, bias: bool):
    x_shape, w_shape, attrs = CASES[case]
    inputs = [rand(*x_shape), rand(*w_shape, seed=1)] + ([rand(w_shape[0], seed=2)] if bias else [])
    return inputs, attrs


@pytest.mark.parametrize("case", CASES)
def test_conv_matches_the_reference(case):
    inputs, attrs = _model(case, bias=True)
    check("Conv", inputs, atol=1e-5, **attrs)


@pytest.mark.compile
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_small_conv_compiles_to_kernel_taps_with_the_same_values_and_gradients(case, bias):
    inputs, attrs = _model(case, bias)
    gm, tensors = convert_model(one_node_model("Conv", inputs, **attrs), inputs)
    [conv] = [m for m in gm.modules() if isinstance(m, Conv)]
    assert conv.direct
    traced = []

    def recording_backend(graph_module, example_inputs):
        traced.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(gm, fullgraph=True, dynamic=False, backend=recording_backend)

    def outputs_and_gradients(module):
        leaves = [t.clone().requires_grad_() for t in tensors]
        [out] = module(*leaves)
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
        return [out.detach()] + [leaf.grad for leaf in leaves]

    for got, expected in zip(outputs_and_gradients(compiled), outputs_and_gradients(gm), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    [graph] = traced
    assert not [node for node in graph.graph.nodes if "conv" in str(node.target)]


@pytest.mark.parametrize("case", CASES)
def test_small_conv_traced_for_a_package_is_kernel_taps_with_the_same_gradients(case):
    inputs, attrs = _model(case, bias=True)
    gm, tensors = convert_model(one_node_model("Conv", inputs, **attrs), inputs)
    seed = torch.linspace(-1, 1, gm(*tensors)[0].numel())

    def gradients(*leaves):
        return torch.func.grad(lambda *args: (gm(*args)[0].reshape(-1) * seed).sum(), argnums=(0, 1, 2))(*leaves)

    traced = make_fx(gradients)(*tensors)  # as the package builder traces a step
    assert not [node for node in traced.graph.nodes if "conv" in str(node.target)]
    for got, expected in zip(traced(*tensors), gradients(*tensors), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_large_conv_stays_with_the_conv_kernel():
    inputs = [rand(64, 3, 32, 32), rand(16, 3, 3, 3, seed=1)]
    gm, _ = convert_model(one_node_model("Conv", inputs), inputs)
    assert not [m for m in gm.modules() if isinstance(m, Conv)][0].direct
    many_taps = [rand(2, 3, 16, 16), rand(8, 3, 4, 4, seed=1)]  # a patchifying stem: 16 taps, few multiply-adds
    gm, _ = convert_model(one_node_model("Conv", many_taps, strides=[4, 4]), many_taps)
    assert not [m for m in gm.modules() if isinstance(m, Conv)][0].direct
    grouped = [rand(2, 4, 6, 6), rand(4, 1, 3, 3, seed=1)]
    gm, _ = convert_model(one_node_model("Conv", grouped, group=4), grouped)
    assert not [m for m in gm.modules() if isinstance(m, Conv)][0].direct
    assert np.isfinite(gm(*[torch.from_numpy(a) for a in grouped])[0].numpy()).all()
