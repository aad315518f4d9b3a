"""Large float32 CPU GEMMs on oneDNN: the eager ``linear`` and the compiled graphs' post-grad pass give
F.linear's values and gradients (to float32 rounding); small, autocast and torch.func products stay F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ort_torch_train.passes import onednn_linear
from ort_torch_train.passes.onednn_linear import linear
from ort_torch_train.training.compile.settings import for_device

pytestmark = pytest.mark.skipif(not onednn_linear.enabled(), reason="oneDNN is not available in this torch build")


def _operands(rows: int = 256, inputs: int = 256, outputs: int = 256, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows // 8, 8, inputs, generator=generator)
    weight = torch.randn(outputs, inputs, generator=generator) / inputs**0.5
    bias = torch.randn(outputs, generator=generator)
    upstream = torch.randn(rows // 8, 8, outputs, generator=generator)
    return x, weight, bias, upstream


def _values_and_grads(function, x, weight, bias, upstream):
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out = function(*leaves)
    out.backward(upstream)
    return out.detach(), [leaf.grad for leaf in leaves]


def _ops_called(function, *args) -> set[str]:
    seen = set()

    class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func))
            return func(*args, **(kwargs or {}))

    with Recorder():
        function(*args)
    return seen


def test_a_large_product_runs_on_onednn_with_f_linear_values_and_gradients():
    x, weight, bias, upstream = _operands()
    assert x.numel() * weight.shape[0] >= onednn_linear.EAGER_MIN_MACS
    assert "mkldnn._linear_pointwise.default" in _ops_called(linear, x, weight, bias)
    got, got_grads = _values_and_grads(linear, x, weight, bias, upstream)
    expected, expected_grads = _values_and_grads(F.linear, x, weight, bias, upstream)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for name, grad, reference in zip(("x", "weight", "bias"), got_grads, expected_grads):
        torch.testing.assert_close(grad, reference, atol=1e-4, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_small_autocast_and_torch_func_products_stay_f_linear():
    x, weight, bias, upstream = _operands()
    small = (x[:1, :2], weight, bias)
    assert "mkldnn._linear_pointwise.default" not in _ops_called(linear, *small)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x, weight, bias).dtype == torch.bfloat16
    loss = lambda w: (linear(x, w, bias) * upstream).sum()  # noqa: E731
    reference = lambda w: (F.linear(x, w, bias) * upstream).sum()  # noqa: E731
    assert torch.equal(torch.func.grad(loss)(weight), torch.func.grad(reference)(weight))


@pytest.mark.compile
def test_compiled_func_grad_sends_its_gemms_to_onednn_and_matches_eager():
    """The one-graph step's shape: torch.func.grad inside torch.compile, with the post-grad pass."""
    x, weight, bias, upstream = _operands()

    def gradients(weight, bias):
        return torch.func.grad(lambda w, b: (linear(x, w, b) * upstream).sum(), argnums=(0, 1))(weight, bias)

    compiled = torch.compile(gradients, fullgraph=True, **for_device({}, torch.device("cpu")))
    from torch._inductor.utils import run_and_get_code

    (grad_weight, grad_bias), code = run_and_get_code(compiled, weight, bias)
    assert "onednn_linear" in "".join(code)
    expected_weight, expected_bias = torch.func.grad(lambda w, b: (F.linear(x, w, b) * upstream).sum(), argnums=(0, 1))(
        weight, bias
    )
    torch.testing.assert_close(grad_weight, expected_weight, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(grad_bias, expected_bias, atol=1e-4, rtol=1e-5)
