"""Matrix products of low-precision frozen weights in compiled graphs (passes/frozen_products.py): the
gradients of a plain upcast product, eager and compiled; compiled LoRA steps that train as eager ones;
and no float32 copy of every frozen weight at once."""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.adapters.linear import gemm
from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.convert.meta_keys import INPUT_REQUIRES_GRAD
from ort_torch_train.lora import LoraConfig
from ort_torch_train.passes import onednn_linear
from ort_torch_train.passes.frozen_products import frozen_product, products_upcast_twice
from ort_torch_train.passes.meta_keys import FUSIONS
from tests.helpers.lora_models import TARGETS, batches, lora_artifacts, tiny_lm
from tests.helpers.step_peak import run_printing_mb

WEIGHT = torch.randn(12, 10, generator=torch.Generator().manual_seed(0)).bfloat16()
# (kind, transposed, alpha, beta, x's shape, bias's shape, the plain product of x, the upcast weight, bias)
CASES = {
    "matmul": ("matmul", False, 1.0, 1.0, (2, 3, 12), None, lambda x, w, b: torch.matmul(x, w)),
    "linear": ("linear", True, 1.0, 1.0, (2, 3, 10), (12,), F.linear),
    "gemm": (
        "gemm",
        True,
        0.5,
        2.0,
        (3, 10),
        (1, 12),
        lambda x, w, b: gemm(x, w, b, alpha=0.5, beta=2.0, trans_a=False, trans_b=True),
    ),  # fmt: skip
    "gemm without c": (
        "gemm",
        False,
        1.5,
        1.0,
        (3, 12),
        None,
        lambda x, w, b: gemm(x, w, None, alpha=1.5, beta=0.0, trans_a=False, trans_b=False),
    ),  # fmt: skip
}


def _case_inputs(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The case's x and bias (a zero scalar for a case without one), seeded."""
    _, _, _, _, x_shape, bias_shape, _ = CASES[name]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(x_shape, generator=generator)
    return x, torch.randn(bias_shape, generator=generator) if bias_shape else torch.zeros(())


def _product_and_gradients(name: str, upcast_plainly: bool) -> Callable[..., tuple[torch.Tensor, ...]]:
    """(x, bias) -> the case's product and the gradients of its squares' sum with respect to x and bias:
    of ``frozen_product``, or (``upcast_plainly``) of the plain product of the float32 weight."""
    kind, transposed, alpha, beta, _, bias_shape, plain = CASES[name]

    def product(x, b):
        if upcast_plainly:
            return plain(x, WEIGHT.float(), b if bias_shape else None)
        return frozen_product(x, WEIGHT, b if bias_shape else None, kind, transposed, alpha, beta)

    gradients = torch.func.grad(lambda x, b: (product(x, b).square()).sum(), argnums=(0, 1))
    return lambda x, b: (product(x, b), *gradients(x, b))


def _assert_as_the_plain_product(name: str, got: tuple[torch.Tensor, ...]) -> None:
    expected = _product_and_gradients(name, upcast_plainly=True)(*_case_inputs(name))
    for value, want in zip(got, expected, strict=True):
        torch.testing.assert_close(value, want, rtol=1e-6, atol=1e-6, msg=lambda m: f"case {name!r}: {m}")


@pytest.mark.parametrize("name", CASES)
def test_a_frozen_product_has_the_plain_upcast_products_values_and_gradients(name: str) -> None:
    _assert_as_the_plain_product(name, _product_and_gradients(name, upcast_plainly=False)(*_case_inputs(name)))


@pytest.mark.compile
def test_compiled_frozen_products_have_the_plain_upcast_products_values_and_gradients() -> None:
    """Every case's product and gradients, compiled together in one full graph (one compilation)."""
    steps = {name: _product_and_gradients(name, upcast_plainly=False) for name in CASES}
    torch._dynamo.reset()
    compiled = torch.compile(lambda inputs: {name: steps[name](*inputs[name]) for name in CASES}, fullgraph=True)
    for name, got in compiled({name: _case_inputs(name) for name in CASES}).items():
        _assert_as_the_plain_product(name, got)


def test_only_products_of_inputs_converted_as_frozen_are_rewritten() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4, 12, device="meta")
    INPUT_REQUIRES_GRAD.set(x, False)
    products = []
    for name, requires_grad in (("frozen", False), ("trainable", True), ("unknown", None)):
        weight = graph.placeholder(name)
        weight.meta["val"] = torch.empty(12, 10, dtype=torch.bfloat16, device="meta")
        if requires_grad is not None:
            INPUT_REQUIRES_GRAD.set(weight, requires_grad)
        cast = graph.call_method("to", (weight, torch.float32))
        cast.meta["val"] = torch.empty(12, 10, device="meta")
        products.append(graph.call_function(torch.matmul, (x, cast)))
    graph.output(tuple(products))
    module = fx.GraphModule(torch.nn.Module(), graph)
    products_upcast_twice(module, torch.device("cpu"))
    assert [node.target for node in module.graph.find_nodes(op="output")[0].args[0]] == [
        frozen_product,
        torch.matmul,
        torch.matmul,
    ]
    assert FUSIONS.get(module, Counter())["frozen product upcast twice"] == 1


def test_a_product_retargeted_to_onednn_is_rewritten_too() -> None:
    graph = fx.Graph()
    x, weight = graph.placeholder("x"), graph.placeholder("frozen")
    x.meta["val"] = torch.empty(4, 10, device="meta")
    INPUT_REQUIRES_GRAD.set(x, False)
    weight.meta["val"] = torch.empty(12, 10, dtype=torch.bfloat16, device="meta")
    INPUT_REQUIRES_GRAD.set(weight, False)
    cast = graph.call_method("to", (weight, torch.float32))
    cast.meta["val"] = torch.empty(12, 10, device="meta")
    graph.output(graph.call_function(onednn_linear.linear, (x, cast)))
    module = fx.GraphModule(torch.nn.Module(), graph)
    products_upcast_twice(module, torch.device("cpu"))
    assert module.graph.find_nodes(op="output")[0].args[0].target is frozen_product


@pytest.mark.compile
def test_compiled_lora_steps_on_bfloat16_frozen_weights_train_as_eager_ones(tmp_path) -> None:
    lora_artifacts("gpt2", tmp_path, None, model=tiny_lm("gpt2"))
    results = {}
    for compile in (False, True):
        config = LoraConfig(r=4, alpha=8, targets=TARGETS["gpt2"][0], frozen_dtype=torch.bfloat16)
        state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
        module = Module(tmp_path / "training_model.onnx", state, lora=config, compile=compile)
        optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
        optimizer.set_learning_rate(0.01)
        losses = [float(module.step(optimizer, tokens, labels)) for tokens, labels in batches(4)]
        results[compile] = losses, module.get_contiguous_parameters(trainable_only=True).numpy()
        if compile:
            (step,) = module.train_graph._cache.values()
            counts = FUSIONS.get(step._compilation.module, Counter())
            assert counts["frozen product upcast twice"] >= 3  # c_attn, c_proj, c_fc
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(results[True][1], results[False][1], rtol=0, atol=1e-5)


PEAK_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.lora import LoraConfig
    from tests.helpers.step_peak import step_peak_growth_mb
    from tests.unit.lora.helpers import make_artifacts

    torch.manual_seed(0)
    layers = [module for _ in range(8) for module in (torch.nn.Linear(1024, 1024, bias=False), torch.nn.ReLU())]
    make_artifacts(sys.argv[1], None, torch.nn.Sequential(torch.nn.Linear(8, 1024), *layers, torch.nn.Linear(1024, 4)))
    lora = LoraConfig(r=2, alpha=4, targets=["*.weight"], frozen_dtype=torch.bfloat16)
    state = CheckpointState.load_checkpoint(f"{sys.argv[1]}/checkpoint")
    module = Module(f"{sys.argv[1]}/training_model.onnx", state, lora=lora, compile=True)
    optimizer = Optimizer(f"{sys.argv[1]}/optimizer_model.onnx", module)
    x, y = np.ones((6, 8), np.float32), np.arange(6, dtype=np.int64) % 4
    print(step_peak_growth_mb(lambda: module.step(optimizer, x, y)))
    """
)
COPIES_MB = 8 * 1024 * 1024 * 4 / 2**20  # float32 copies of the eight 1024 x 1024 frozen weights: 32 MB


@pytest.mark.compile
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads and resets the peak RSS in /proc")
def test_a_compiled_step_never_holds_every_frozen_weights_float32_copy(tmp_path) -> None:
    growth_mb = run_printing_mb(PEAK_SCRIPT, tmp_path)
    # casting every frozen weight at the graph's start, or keeping each copy for backward, adds COPIES_MB
    assert growth_mb < COPIES_MB / 2, f"a step's peak RSS grew {growth_mb:.1f} MB over its start"
