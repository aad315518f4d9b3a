"""Pattern fusions on real exporter output (legacy opset 17 and dynamo): each fires, and the fused
graph's outputs and parameter gradients match the unfused graph's and the torch model's."""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.pipeline import fuse_converted, run_eager
from tests.helpers.exported_models import export_training_graph, parameters_as_inputs
from tests.helpers.lora_models import Logits
from tests.unit.convert.test_exporters import TinyGPT


class TinyLlama(nn.Module):
    """RMSNorm (pow-mean-rsqrt), rotary embedding, causal SDPA, SiLU-gated MLP: Llama's block; then a
    LayerNorm written out (mean, centre, variance, sqrt, divide, affine) and a tanh GELU."""

    def __init__(self, vocab: int = 11, d: int = 16, heads: int = 2, context: int = 8):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d)
        self.norm1, self.norm2 = nn.Parameter(torch.rand(d) + 0.5), nn.Parameter(torch.rand(d) + 0.5)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.weight, self.bias = nn.Parameter(torch.rand(d) + 0.5), nn.Parameter(torch.randn(d) * 0.1)
        half = d // heads // 2
        angles = torch.outer(torch.arange(context).float(), 10000.0 ** (-torch.arange(half).float() / half))
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos())
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin())

    @staticmethod
    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def rotary(self, x, length):
        first, second = x.chunk(2, -1)
        return x * self.cos[:length] + torch.cat((-second, first), -1) * self.sin[:length]

    def forward(self, ids):
        batch, length = ids.shape
        x = self.embed(ids)
        q, k, v = self.qkv(self.rms(x, self.norm1)).split(x.shape[-1], -1)
        q, k, v = (t.reshape(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = self.rotary(q, length), self.rotary(k, length)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(batch, length, -1))
        h = self.rms(x, self.norm2)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        centred = x - x.mean(-1, keepdim=True)
        y = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight + self.bias
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))


CASES = {
    "gpt": (
        TinyGPT,
        lambda: torch.randint(0, 11, (3, 8)),
        {"linear": 5, "attention": 1, "row_linear": 5},
        {"gelu": 1, "module_to_function": 3},
    ),
    "llama": (
        TinyLlama,
        lambda: torch.randint(0, 11, (3, 8)),
        {
            "linear": 5,
            "attention": 1,
            "rms_norm": 2,
            "silu": 1,
            "layer_norm": 1,
            "gelu": 1,
            "rotary": 2,
            "row_linear": 5,
        },
        {},
    ),
}


def _convert(proto, specs, fuse: bool):
    opsets = {o.domain: o.version for o in proto.opset_import}
    module = convert_graph(proto.graph, opsets, specs, training=True)
    if fuse:
        fuse_converted(module, torch.device("cpu"))
    return module


def _outputs_and_grads(gm, x, parameters, weights=None):
    copies = [p.detach().clone().requires_grad_() for p in parameters]
    out = gm(x, *copies)[0]
    weights = torch.randn_like(out) if weights is None else weights
    (out * weights).sum().backward()
    return out.detach(), [c.grad for c in copies], weights


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy17", "dynamo"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fusion_fires_and_matches_the_unfused_graph(name, dynamo):
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model_class, make_input, expected_counts, legacy_only = CASES[name]  # dynamo writes Gelu/LayerNorm as ops
    model, x = model_class().train(), make_input()
    proto = export_training_graph(model, x, dynamo)
    named = dict(model.named_parameters(remove_duplicate=False))
    names = parameters_as_inputs(proto, named)
    parameters = [named[n] for n in names]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (x, *parameters)]
    fused = run_eager(_convert(proto, specs, False), torch.device("cpu"))  # as eager steps run it: rows on 2-D too
    unfused = _convert(proto, specs, False)

    counts = FUSIONS.get(fused, Counter())
    for fusion, count in {**expected_counts, **({} if dynamo else legacy_only)}.items():
        assert counts[fusion] >= count, (fusion, counts)
    assert len(fused.graph.nodes) < len(unfused.graph.nodes)
    decomposed = {torch.erf, torch.tanh, torch.sqrt, torch.softmax, torch.sigmoid}
    assert not decomposed & {n.target for n in fused.graph.nodes if n.op == "call_function"}
    assert all(n.args[0].meta["val"].dim() == 2 for n in fused.graph.nodes if n.target is F.linear)
    # the attention scale (dynamo: sqrt(1/sqrt(E)) on q and on k) folds into SDPA, the causal mask into is_causal
    attention = [n for n in fused.graph.nodes if n.target is F.scaled_dot_product_attention]
    head_dim = model.qkv.out_features // 3 // model.heads
    assert [(len(n.args), n.kwargs["is_causal"]) for n in attention] == [(3, True)]
    assert math.isclose(attention[0].kwargs["scale"], head_dim**-0.5, rel_tol=1e-6)

    got, got_grads, weights = _outputs_and_grads(fused, x, parameters)
    ref, ref_grads, _ = _outputs_and_grads(unfused, x, parameters, weights)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)
    for n, fused_grad, reference in zip(names, got_grads, ref_grads):
        torch.testing.assert_close(fused_grad, reference, atol=1e-5, rtol=1e-4, msg=lambda m: f"{n}: {m}")


def test_a_permute_and_its_inverse_cancel_and_permute_chains_compose():
    class Views(nn.Module):
        def forward(self, x):
            y = x.permute(0, 2, 3, 1).transpose(-2, -1)  # one permute (0, 2, 1, 3)
            z = x.transpose(1, 2).transpose(1, 2)  # cancels
            return y.reshape(2, 12, 5).reshape(2, 60) * 2, z.unsqueeze(0).reshape(2, 3, 4, 5) + 1

    x = torch.randn(2, 3, 4, 5)
    proto = export_training_graph(Views(), x, dynamo=False)
    specs = [TensorSpec(tuple(x.shape), x.dtype)]
    fused = _convert(proto, specs, True)
    methods = [n.target for n in fused.graph.nodes if n.op == "call_method"]
    assert methods.count("permute") == 1 and "transpose" not in methods and methods.count("reshape") <= 1
    for got, expected in zip(fused(x), Views()(x)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_ort_fused_rms_norm_and_quick_gelu_become_torch_calls(alpha):
    """ORT's pre-training optimiser writes Llama's RMSNorm and SiLU as com.microsoft
    SimplifiedLayerNormalization and QuickGelu (alpha 1): they become F.rms_norm and F.silu."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["h"], axis=-1, epsilon=1e-6),
        helper.make_node("QuickGelu", ["h"], ["g"], domain="com.microsoft", alpha=alpha),
        helper.make_node("MatMul", ["g", "w"], ["y"]),
    ]
    inputs = {"x": (2, 4, 8), "scale": (8,), "w": (8, 8)}
    declared = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    graph = helper.make_graph(nodes, "g", declared, [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 4, 8))])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    proto = helper.make_model(graph, opset_imports=opsets)
    torch.manual_seed(0)
    x, scale, w = torch.randn(2, 4, 8), torch.rand(8) + 0.5, torch.randn(8, 8)
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (x, scale, w)]
    fused = run_eager(_convert(proto, specs, False), torch.device("cpu"))  # as eager steps run it: rows on 2-D too
    unfused = _convert(proto, specs, False)

    targets = {n.target for n in fused.graph.nodes if n.op == "call_function"}
    assert F.rms_norm in targets
    assert (F.silu in targets) == (alpha == 1.0)
    got, got_grads, weights = _outputs_and_grads(fused, x, [scale, w])
    ref, ref_grads, _ = _outputs_and_grads(unfused, x, [scale, w], weights)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * scale
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got, (h * torch.sigmoid(alpha * h)) @ w, atol=1e-5, rtol=1e-5)
    for fused_grad, reference in zip(got_grads, ref_grads):
        torch.testing.assert_close(fused_grad, reference, atol=1e-5, rtol=1e-5)


class RotaryFromPositions(nn.Module):
    """Llama's rotary embedding with cos/sin computed from a position input (not constants)."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.heads, self.proj = heads, nn.Linear(d, d, bias=False)
        half = d // heads // 2
        self.register_buffer("inv_freq", 10000.0 ** (-torch.arange(half).float() / half))

    def forward(self, x, positions):
        batch, length, _ = x.shape
        q = self.proj(x).reshape(batch, length, self.heads, -1).transpose(1, 2)
        angles = positions[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        first, second = q[..., : q.shape[-1] // 2], q[..., q.shape[-1] // 2 :]
        return q * cos + torch.cat((-second, first), -1) * sin


def test_rotary_with_computed_sin_fuses_with_one_sign_multiplication():
    import io
    import warnings

    import onnx

    torch.manual_seed(0)
    model, x, positions = RotaryFromPositions(), torch.randn(3, 5, 8), torch.arange(5).float() + 2.0
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x, positions), buffer, opset_version=17, dynamo=False, do_constant_folding=False)
    proto = onnx.load_from_string(buffer.getvalue())
    names = parameters_as_inputs(proto, dict(model.named_parameters()))
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (x, positions, model.proj.weight)]
    fused = run_eager(_convert(proto, specs, False), torch.device("cpu"))  # as eager steps run it: rows on 2-D too
    unfused = _convert(proto, specs, False)

    assert FUSIONS.get(fused, Counter())["rotary"] == 1 and names == ["proj.weight"]
    assert not {torch.neg} & {n.target for n in fused.graph.nodes if n.op == "call_function"}
    assert [n.target for n in fused.graph.nodes if n.op == "get_attr" and "rotary_sign" in n.target] == ["rotary_sign"]
    weight = model.proj.weight.detach().clone().requires_grad_()
    reference_weight = weight.detach().clone().requires_grad_()
    got, expected = fused(x, positions, weight)[0], unfused(x, positions, reference_weight)[0]
    assert torch.equal(got, expected)  # the sign folds exactly
    torch.testing.assert_close(got, model(x, positions))
    upstream = torch.randn_like(got)
    (got * upstream).sum().backward()
    (expected * upstream).sum().backward()
    torch.testing.assert_close(weight.grad, reference_weight.grad, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("fully_masked_row", [False, True], ids=["causal", "a-row-masked-everywhere"])
def test_transformers_sdpa_attention_with_the_exporters_nan_guard_fuses(fully_masked_row):
    """transformers' GPT-2 (SDPA attention) exports softmax(scores + where(mask, 0, -inf)) followed by
    where(isnan(p), 0, p): it fuses to causal SDPA, unless a query attends nowhere (the guard then matters)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=50, n_positions=8, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False, attn_implementation="sdpa", bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Logits(transformers.GPT2LMHeadModel(config)).train()
    x = torch.randint(0, 50, (2, 8))
    proto = export_training_graph(model, x, False)
    named = dict(model.named_parameters(remove_duplicate=False))
    names = parameters_as_inputs(proto, named)
    parameters = [named[n] for n in names]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (x, *parameters)]
    fused = _convert(proto, specs, False)
    if fully_masked_row:  # the first query of each layer's mask attends nowhere
        for name, buffer in fused.constants.named_buffers():
            if buffer.shape[-2:] == (8, 8) and buffer.is_floating_point():
                buffer[..., 0, :] = -torch.inf
    unfused = copy.deepcopy(fused)
    fuse_converted(fused, torch.device("cpu"))

    attention = [n for n in fused.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert [n.kwargs.get("is_causal") for n in attention] == ([] if fully_masked_row else [True, True])
    got, got_grads, weights = _outputs_and_grads(fused, x, parameters)
    ref, ref_grads, _ = _outputs_and_grads(unfused, x, parameters, weights)
    assert not got.isnan().any()  # the guarded softmax's backward is NaN on a row masked everywhere
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    for n, fused_grad, reference in zip(names, got_grads, ref_grads):
        torch.testing.assert_close(
            fused_grad, reference, atol=1e-5, rtol=1e-4, equal_nan=True, msg=lambda m: f"{n}: {m}"
        )
