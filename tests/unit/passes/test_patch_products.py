"""Patch convolutions in compiled graphs (passes/patch_products.py): the product gives the convolution's
values and gradients, the rewrite fires only on convolutions whose kernel equals their strides without
padding, dilation or groups, and traced with a dynamic batch it keeps batch 1 in the graph of the other
sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.adapters.conv import Conv
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.patch_products import patch_products, patches_product
from ort_torch_train.torch_internals import compile_counters, size_one_kept_dynamic


@pytest.mark.parametrize(
    ("shape", "kernel", "with_bias"),
    [((4, 3, 16, 16), (4, 4), True), ((1, 3, 17, 18), (4, 3), False), ((2, 8, 6, 6), (2, 2), True)],
    ids=["vit", "batch-1-with-a-remainder", "downsampling"],
)
def test_the_product_has_the_convolutions_values_and_gradients(shape, kernel, with_bias):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, shape[1], *kernel, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True) if with_bias else None
    inputs = [x, weight] + ([bias] if bias is not None else [])
    expected = F.conv2d(x, weight, bias, stride=kernel)
    found = patches_product(x, weight, bias)
    assert found.is_contiguous()
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-12)
    gradient = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(found, inputs, gradient), torch.autograd.grad(expected, inputs, gradient)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_under_autocast_the_product_is_the_convolution():
    torch.manual_seed(0)
    x, weight, bias = torch.randn(2, 3, 16, 16), torch.randn(5, 3, 4, 4), torch.randn(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.conv2d(x, weight, bias, stride=4)
        found = patches_product(x, weight, bias)
    assert found.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(found, expected, rtol=0, atol=0)


class _Convs(torch.nn.Module):
    """A patch convolution and four that are not (overlapping, padded, dilated, grouped), as converted."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = Conv(2, (4, 4), (0, 0, 0, 0), (1, 1), 1)
        self.overlapping = Conv(2, (2, 2), (0, 0, 0, 0), (1, 1), 1)
        self.padded = Conv(2, (4, 4), (1, 1, 1, 1), (1, 1), 1)
        self.dilated = Conv(2, (4, 4), (0, 0, 0, 0), (2, 2), 1)
        self.grouped = Conv(2, (4, 4), (0, 0, 0, 0), (1, 1), 2)

    def forward(self, x, weight, half_weight):
        return (
            self.patch(x, weight),
            self.overlapping(x, weight),
            self.padded(x, weight),
            self.dilated(x, weight),
            self.grouped(x, half_weight),
        )


class _ConvLeaves(fx.Tracer):
    def is_leaf_module(self, module: torch.nn.Module, name: str) -> bool:
        return isinstance(module, Conv) or super().is_leaf_module(module, name)


class _Recording(fx.Interpreter):
    """Runs a graph, keeping each node's tensor as its ``meta["val"]`` (as the conversion does)."""

    def run_node(self, node: fx.Node) -> object:
        value = super().run_node(node)
        node.meta["val"] = value if isinstance(value, torch.Tensor) else None
        return value


def test_only_patch_convolutions_are_rewritten():
    root = _Convs()
    module = fx.GraphModule(root, _ConvLeaves().trace(root))
    torch.manual_seed(0)
    example = (torch.randn(2, 4, 16, 16), torch.randn(3, 4, 4, 4), torch.randn(4, 2, 4, 4))
    expected = module(*example)
    _Recording(module).run(*example)
    patch_products(module, torch.device("cpu"))
    module.recompile()
    assert [node.target for node in module.graph.nodes].count(patches_product) == 1
    assert [node.target for node in module.graph.nodes if node.op == "call_module"] == [
        "overlapping", "padded", "dilated", "grouped",
    ]  # fmt: skip
    assert FUSIONS.get(module, {})["patch_products"] == 1
    for got, want in zip(module(*example), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def _patch_loss(x: torch.Tensor, weight: torch.Tensor, product=None) -> torch.Tensor:
    """A patch embedding (16x16 images, 4x4 patches) flattened to tokens, as a vision transformer's."""
    patches = F.conv2d(x, weight, stride=4) if product is None else product(x, weight)
    tokens = patches.flatten(2).transpose(1, 2)
    return tokens.square().sum()


@pytest.mark.compile
def test_a_dynamic_batch_compiles_one_graph_with_batch_1_under_inductor():
    """With the convolution, inductor asks torch which conv backend the sizes' hints pick, a choice that
    depends on the batch being over 1: batch 1 compiles a second graph (2 graphs over these batches). The
    product compiles one graph, with the weight's gradient."""
    torch._dynamo.reset()
    compile_counters().clear()
    step = torch.compile(torch.func.grad(_patch_loss, argnums=1), backend="inductor", dynamic=False)
    with size_one_kept_dynamic(True):
        for batch in (4, 3, 1, 2):
            x, weight = torch.rand(batch, 3, 16, 16), torch.rand(8, 3, 4, 4)  # positive: sums without cancellation
            torch._dynamo.mark_dynamic(x, 0)  # the batch, as a Module marks its dynamic axes
            expected = torch.func.grad(_patch_loss, argnums=1)(x.double(), weight.double()).float()
            torch.testing.assert_close(step(x, weight, patches_product), expected, rtol=1e-6, atol=0)
    assert compile_counters()["stats"]["unique_graphs"] == 1
