"""Small attention in compiled CPU graphs (passes/small_attention.py): the products equal SDPA, the rewrite
fires only on small float32 heads, and compiled steps with it train as eager steps do."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.pipeline import run_passes
from ort_torch_train.passes.small_attention import attention_products, small_attention_products
from ort_torch_train.training.forward_graph import ForwardGraph

pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
SHAPE = (4, 2, 8, 16)  # batch, heads, positions, head size: tiny-bert's
MASKS = {
    "none": lambda: {},
    "additive": lambda: {"attn_mask": torch.where(torch.rand(4, 1, 1, 8) < 0.3, -1e4, 0.0)},
    "boolean": lambda: {"attn_mask": torch.rand(4, 1, 8, 8) < 0.8},
    "causal": lambda: {"is_causal": True},
}


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_products_match_sdpa_values_and_gradients(mask):
    torch.manual_seed(0)
    tensors = [torch.randn(SHAPE, requires_grad=True) for _ in range(3)]
    keywords = {**MASKS[mask](), "scale": 0.3}
    if mask == "boolean":
        keywords["attn_mask"][..., 0] = True  # every query sees a key
    weights = torch.randn(SHAPE)
    results = []
    for attention in (F.scaled_dot_product_attention, attention_products):
        output = attention(*tensors, **keywords)
        results.append((output.detach(), torch.autograd.grad((output * weights).sum(), tensors)))
    (expected, expected_grads), (got, got_grads) = results
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    for grad, expected_grad in zip(got_grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-5)


def test_under_autocast_the_products_are_sdpa_itself():
    q, k, v = (torch.randn(SHAPE) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attention_products(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
        expected = F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


class CausalAttention(nn.Module):
    """One causal self-attention layer over 8 positions, mean-pooled to 3 classes."""

    def __init__(self, heads: int, width: int = 32):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(width, 3 * width), nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, positions, width = x.shape
        q, k, v = (t.reshape(batch, positions, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, positions, width).mean(1))


def _train(
    directory: Path, x: np.ndarray, y: np.ndarray, compile: bool, mixed_precision: str | None = None
) -> list[float]:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(
        directory / "training_model.onnx",
        state,
        directory / "eval_model.onnx",
        compile=compile,
        mixed_precision=mixed_precision,
    )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    return [float(module.step(optimizer, x, y)) for _ in range(4)]


@pytest.mark.compile
@pytest.mark.parametrize("heads,rewritten", [(2, 1), (4, 0)], ids=["head16", "head8"])
def test_a_compiled_step_rewrites_small_heads_and_trains_as_the_eager_step(heads, rewritten, tmp_path, monkeypatch):
    torch.manual_seed(0)
    x, y = torch.randn(4, 8, 32), torch.randint(0, 3, (4,))
    generate_artifacts(
        CausalAttention(heads),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(x,),
    )
    fusions = []

    compiled_module = ForwardGraph.compiled_module

    def recorded(graph, module, device):
        module = compiled_module(graph, module, device)
        fusions.append(dict(FUSIONS.get(module, Counter())))
        return module

    monkeypatch.setattr(ForwardGraph, "compiled_module", recorded)
    compiled = _train(tmp_path, x.numpy(), y.numpy(), compile=True)
    assert [f.get("small_attention", 0) for f in fusions] == [rewritten] and fusions[0]["attention"] == 1
    np.testing.assert_allclose(compiled, _train(tmp_path, x.numpy(), y.numpy(), compile=False), rtol=0, atol=1e-5)
    if rewritten:  # under bf16 autocast the compiled step keeps SDPA and follows the eager bf16 step
        eager_bf16 = _train(tmp_path, x.numpy(), y.numpy(), compile=False, mixed_precision="bf16")
        compiled_bf16 = _train(tmp_path, x.numpy(), y.numpy(), compile=True, mixed_precision="bf16")
        np.testing.assert_allclose(compiled_bf16, eager_bf16, rtol=0, atol=2e-2)


class Attend(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def _traced_attention() -> torch.fx.GraphModule:
    module = torch.fx.symbolic_trace(Attend())
    for node in module.graph.find_nodes(op="placeholder"):
        node.meta["val"] = torch.empty(SHAPE)
    return module


def test_graphs_for_other_devices_are_left_alone():
    module = _traced_attention()
    code = module.code
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert run_passes(module, [small_attention_products], cuda) is module and module.code == code
    assert FUSIONS.get(run_passes(module, [small_attention_products], cpu), None) == {"small_attention": 1}
    assert "attention_products" in module.code
