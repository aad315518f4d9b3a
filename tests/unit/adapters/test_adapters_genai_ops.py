"""com.microsoft GroupQueryAttention, MatMulNBits and (Skip)SimplifiedLayerNormalization, as
onnxruntime-genai's builder emits them: outputs against onnxruntime on the CPU, gradients against
float64 torch references."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

from ort_torch_train.adapters import matmul_nbits
from ort_torch_train.adapters.group_query_attention import GroupQueryAttention
from ort_torch_train.adapters.matmul_nbits import MatMulNBits, dequantize_nbits
from ort_torch_train.errors import ModelError
from tests.helpers.adapter_harness import convert_model, rand
from tests.helpers.tolerances import assert_close_to_terms

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"


def ms_model(op_type: str, inputs: list, constant=(), outputs: int = 1, **attrs) -> onnx.ModelProto:
    """One com.microsoft node; ``inputs`` entries None are absent, positions in ``constant`` are initializers."""
    names = ["" if value is None else f"in{i}" for i, value in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"out{i}" for i in range(outputs)], domain=MS, **attrs)
    graph_inputs, initializers = [], []
    for i, (name, value) in enumerate(zip(names, inputs)):
        if value is None:
            continue
        if i in constant:
            initializers.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(value.shape)))
    graph_outputs = [helper.make_empty_tensor_value_info(f"out{i}") for i in range(outputs)]
    graph = helper.make_graph([node], "one_node", graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def ort_and_converted(model: onnx.ModelProto, inputs: list) -> tuple[list[np.ndarray], list[np.ndarray]]:
    feeds = {vi.name: inputs[int(vi.name[2:])] for vi in model.graph.input}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    gm, tensors = convert_model(model, inputs)
    got = gm(*tensors)
    got = got if isinstance(got, (tuple, list)) else (got,)
    return [g.detach().numpy() for g in got], expected


# GroupQueryAttention -----------------------------------------------------------------------------
B, HEADS, KV_HEADS, SIZE = 2, 4, 2, 16
COS_SIN = np.linspace(0, 3, 16 * SIZE // 2, dtype=np.float32).reshape(16, SIZE // 2)
COS, SIN = np.cos(COS_SIN), np.sin(COS_SIN)


def gqa_inputs(seq: int, past: int, seqlens: list[int], total: int, packed: bool, rotary: bool) -> list:
    batch = len(seqlens)
    q = rand(batch, seq, HEADS * SIZE, seed=1)
    k, v = rand(batch, seq, KV_HEADS * SIZE, seed=2), rand(batch, seq, KV_HEADS * SIZE, seed=3)
    if packed:
        q, k, v = np.concatenate([q, k, v], axis=-1), None, None
    past_k, past_v = rand(batch, KV_HEADS, past, SIZE, seed=4), rand(batch, KV_HEADS, past, SIZE, seed=5)
    lengths = np.array(seqlens, dtype=np.int32) - 1
    caches = [COS, SIN] if rotary else [None, None]
    return [q, k, v, past_k, past_v, lengths, np.array(total, dtype=np.int32), *caches]


@pytest.mark.parametrize(
    "seq, past, seqlens, total, packed, rotary, attrs",
    [
        (5, 0, [5, 5], 5, False, False, {}),
        (5, 0, [5, 5], 5, True, True, {}),
        (5, 0, [5, 5], 5, True, True, {"rotary_interleaved": 1}),
        (5, 0, [5, 3], 5, True, True, {}),  # right-padded prompt
        (1, 4, [5, 5], 5, True, True, {}),  # token phase
        (2, 3, [5], 5, False, True, {}),  # a later chunk of the prompt (ORT: batch 1 only)
        (5, 0, [5, 5], 5, False, False, {"softcap": 2.0, "scale": 0.3}),
        (6, 0, [6, 6], 6, True, True, {"local_window_size": 2}),
    ],
)
def test_group_query_attention_matches_onnxruntime(seq, past, seqlens, total, packed, rotary, attrs):
    inputs = gqa_inputs(seq, past, seqlens, total, packed, rotary)
    model = ms_model(
        "GroupQueryAttention", inputs, outputs=3, num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=int(rotary), **attrs
    )
    got, expected = ort_and_converted(model, inputs)
    for b in range(len(seqlens)):  # rows of real tokens: a right-padded prompt's padded queries are undefined
        rows = seqlens[b] if seq == total else seq
        np.testing.assert_allclose(got[0][b, :rows], expected[0][b, :rows], atol=2e-6, rtol=1e-5)
        for g, e in zip(got[1:], expected[1:]):
            assert g.shape == e.shape
            np.testing.assert_allclose(g[b, :, : past + rows], e[b, :, : past + rows], atol=2e-6, rtol=1e-5)


def test_group_query_attention_gradients_match_float64_reference():
    module = GroupQueryAttention(2, 1, None, 0.0, -1, True, False)  # small: float64 finite differences
    q, k, v = (torch.randn(2, 3, n * 4, dtype=torch.float64, requires_grad=True) for n in (2, 1, 1))
    lengths, total = torch.tensor([2, 1], dtype=torch.int32), torch.tensor(3, dtype=torch.int32)
    caches = torch.from_numpy(COS[:, :2]).double(), torch.from_numpy(SIN[:, :2]).double()

    def function(q, k, v):
        return module(q, k, v, None, None, lengths, total, *caches)[0]

    assert torch.autograd.gradcheck(function, (q, k, v), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("attrs", [{"smooth_softmax": 1}, {"k_quant_type": "PER_TENSOR"}])
def test_group_query_attention_unsupported_attributes_raise(attrs):
    inputs = gqa_inputs(3, 0, [3, 3], 3, True, False)
    model = ms_model("GroupQueryAttention", inputs, outputs=3, num_heads=HEADS, kv_num_heads=KV_HEADS, **attrs)
    with pytest.raises((NotImplementedError, ModelError), match=next(iter(attrs))):
        convert_model(model, inputs)


# MatMulNBits ------------------------------------------------------------------------------------
def quantized_weight(k: int, n: int, bits: int, block: int, zero_points: bool, seed: int = 0):
    """Random packed weight, scales and (packed uint8) zero points in MatMulNBits' layout."""
    generator = np.random.default_rng(seed)
    blocks = (k + block - 1) // block
    values = generator.integers(0, 1 << bits, size=(n, blocks, block), dtype=np.uint8)
    per_byte = 8 // bits
    packed = np.zeros((n, blocks, block // per_byte), dtype=np.uint8)
    for i in range(per_byte):
        packed |= values[..., i::per_byte] << (i * bits)
    scales = (generator.random((n * blocks,)) * 0.1 + 0.01).astype(np.float32)
    if not zero_points:
        return packed, scales, None
    zero = generator.integers(0, 1 << bits, size=(n, blocks), dtype=np.uint8)
    zero = np.pad(zero, ((0, 0), (0, (-blocks) % per_byte)))
    zero_packed = np.zeros((n, zero.shape[1] // per_byte), dtype=np.uint8)
    for i in range(per_byte):
        zero_packed |= zero[:, i::per_byte] << (i * bits)
    return packed, scales, zero_packed.reshape(-1)


@pytest.mark.parametrize(
    "bits, block, k, zero_points, bias",
    [
        (4, 32, 64, False, False),
        (4, 32, 96, True, True),
        (4, 16, 40, True, False),
        (2, 32, 64, True, False),
        (8, 32, 64, False, True),
        (8, 64, 48, True, False),
    ],
)
@pytest.mark.parametrize("chunk", [None, 5 * 64])  # whole weight, or blocks of rows dequantised one at a time
def test_matmul_nbits_matches_onnxruntime(bits, block, k, zero_points, bias, chunk, monkeypatch):
    if chunk is not None:
        monkeypatch.setattr(matmul_nbits, "CHUNK_ELEMENTS", chunk)
    n = 24
    packed, scales, zero = quantized_weight(k, n, bits, block, zero_points)
    inputs = [rand(2, 3, k), packed, scales, zero, None, rand(n, seed=7) if bias else None]
    model = ms_model(
        "MatMulNBits", inputs, constant=(1, 2, 3, 5), K=k, N=n, bits=bits, block_size=block, accuracy_level=0
    )
    got, expected = ort_and_converted(model, inputs)
    weight = dequantize_nbits(
        *(torch.from_numpy(t) if t is not None else None for t in (packed, scales, zero)),
        bits=bits,
        block_size=block,
        k=k,
        n=n,
    )
    terms = torch.from_numpy(inputs[0]).double().abs() @ weight.double().abs().t()
    if bias:
        terms += torch.from_numpy(inputs[5]).double().abs()
    # float32 sums of k products in another order and kernel (ORT's, or torch's at another thread count)
    assert_close_to_terms(got[0], expected[0], terms, rtol=1e-6)


def test_matmul_nbits_gradient_matches_float64_reference_and_keeps_no_float_weight(monkeypatch):
    monkeypatch.setattr(matmul_nbits, "CHUNK_ELEMENTS", 3 * 64)  # several row blocks in forward and backward
    k, n = 64, 16
    packed, scales, zero = (torch.from_numpy(t) for t in quantized_weight(k, n, 4, 32, True))
    module = MatMulNBits(k, n, 4, 32)
    a = torch.randn(3, k, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: module(a, packed, scales.double(), zero), (a,), eps=1e-6, atol=1e-6)
    weight = dequantize_nbits(packed, scales.double(), zero, bits=4, block_size=32, k=k, n=n)
    reference = a.detach().clone().requires_grad_()
    (reference @ weight.t()).square().sum().backward()
    module(a, packed, scales.double(), zero).square().sum().backward()
    torch.testing.assert_close(a.grad, reference.grad, rtol=1e-12, atol=1e-12)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        module(a.float().detach().requires_grad_(), packed, scales, zero)
    assert all(t.dtype == torch.uint8 or t.numel() < n * k for t in saved), [(t.dtype, t.shape) for t in saved]


# (Skip)SimplifiedLayerNormalization --------------------------------------------------------------
@pytest.mark.parametrize("with_bias, outputs", [(False, 1), (True, 4), (False, 4)])
def test_skip_simplified_layer_norm_matches_onnxruntime(with_bias, outputs):
    inputs = [rand(2, 3, 16), rand(2, 3, 16, seed=1), rand(16, seed=2), rand(16, seed=3) if with_bias else None]
    model = ms_model("SkipSimplifiedLayerNormalization", inputs, constant=(2, 3), outputs=outputs, epsilon=1e-6)
    if outputs == 4:  # the mean output is not defined for the simplified form: leave it unnamed, as the builder does
        model.graph.node[0].output[1] = ""
        del model.graph.output[1]
    got, expected = ort_and_converted(model, inputs)
    got = [g for g in got if g.ndim]  # the placeholder of the unnamed output
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)


def test_simplified_layer_norm_in_both_domains_matches_onnxruntime():
    """onnxruntime runs the ai.onnx spelling (the builder's); the com.microsoft one converts the same."""
    inputs = [rand(2, 3, 16), rand(16, seed=2)]
    model = ms_model("SimplifiedLayerNormalization", inputs, constant=(1,), epsilon=1e-6)
    model.graph.node[0].domain = ""
    got, expected = ort_and_converted(model, inputs)
    np.testing.assert_allclose(got[0], expected[0], atol=1e-5, rtol=1e-5)
    model.graph.node[0].domain = MS
    gm, tensors = convert_model(model, inputs)
    np.testing.assert_array_equal(gm(*tensors)[0].numpy(), got[0])


# GroupQueryAttention(sliding_window_cache=1) -----------------------------------------------------------
@pytest.mark.parametrize("seq", [3, 6])
def test_group_query_attention_window_cache_with_an_empty_cache_matches_onnxruntime(seq):
    """Gemma2's sliding-window layers: onnxruntime needs a window-sized buffer (it refuses an empty one), then
    attends as local_window_size does and keeps the last min(seq, window) positions at the buffer's front;
    training feeds an empty cache: the same attention, every position in the present."""
    window, attrs = 4, {"num_heads": HEADS, "kv_num_heads": KV_HEADS, "do_rotary": 1, "local_window_size": 4}
    inputs = gqa_inputs(seq, 0, [seq, seq], seq, True, True)
    buffered = gqa_inputs(seq, window, [seq, seq], seq, True, True)
    buffered[0] = inputs[0]
    model = ms_model("GroupQueryAttention", buffered, outputs=3, sliding_window_cache=1, **attrs)
    feeds = {vi.name: buffered[int(vi.name[2:])] for vi in model.graph.input}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    gm, tensors = convert_model(
        ms_model("GroupQueryAttention", inputs, outputs=3, sliding_window_cache=1, **attrs), inputs
    )
    got = [value.detach().numpy() for value in gm(*tensors)]
    np.testing.assert_allclose(got[0], expected[0], atol=2e-6, rtol=1e-5)
    kept = min(seq, window)
    for ours, theirs in zip(got[1:], expected[1:]):
        np.testing.assert_allclose(ours[:, :, seq - kept :], theirs[:, :, :kept], atol=2e-6, rtol=1e-5)
    with pytest.raises(ModelError, match="sliding_window_cache=1 with a past key/value buffer of 4 rows"):
        convert_model(model, buffered)  # a cache of the window's size (genai's token phase): refused, named
