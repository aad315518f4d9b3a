"""com.microsoft GatherBlockQuantized (uint8, bit-packed, as onnxruntime-genai's builder writes a tied
embedding): outputs against onnxruntime's CPU kernel on random tables, the scales' gradient against
float64 torch, and the inputs onnxruntime refuses or fills with zeros raise naming them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ort_torch_train.adapters.gather_block_quantized import GatherBlockQuantized, dequantize_rows
from ort_torch_train.errors import IndexRangeError
from tests.helpers.adapter_harness import convert_model
from tests.unit.adapters.test_adapters_genai_ops import ms_model, ort_and_converted

pytest.importorskip("onnxruntime")


def packed(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` (< 2**bits) packed along the last axis, lowest bits first, the last byte zero-padded."""
    per_byte = 8 // bits
    values = np.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, (-values.shape[-1]) % per_byte)])
    out = np.zeros((*values.shape[:-1], values.shape[-1] // per_byte), dtype=np.uint8)
    for i in range(per_byte):
        out |= (values[..., i::per_byte] << (i * bits)).astype(np.uint8)
    return out


def quantized_table(shape: tuple[int, ...], bits: int, block: int, zero_points: bool, seed: int = 0) -> list:
    """Packed data, float scales and (packed, or None) zero points of a random ``shape`` table."""
    generator = np.random.default_rng(seed)
    blocks = (shape[-1] + block - 1) // block
    data = packed(generator.integers(0, 1 << bits, size=shape, dtype=np.uint8), bits)
    scales = (generator.random((*shape[:-1], blocks)) * 0.1 + 0.01).astype(np.float32)
    zero = packed(generator.integers(0, 1 << bits, size=(*shape[:-1], blocks), dtype=np.uint8), bits)
    return [data, scales, zero if zero_points else None]


@pytest.mark.parametrize(
    "shape, bits, block, zero_points, indices",
    [
        ((256, 64), 4, 32, False, [[3, 0, 255], [7, 7, 1]]),  # the builder's tied embedding: [vocab, hidden]
        ((256, 64), 4, 32, True, [[3, 0, -1]]),
        ((40, 96), 4, 64, False, [5, 39, 0, -40]),  # a partial last block
        ((40, 96), 4, 16, True, [[[1, 2], [3, 4]]]),
        ((32, 64), 8, 32, False, [[0, 31]]),
        ((32, 72), 8, 16, True, [9, 10]),
        ((32, 64), 2, 32, True, [[4, 5, 6]]),
        ((6, 5, 48), 4, 16, True, [[2, 0]]),  # rank 3: blocks along the last axis of each [5, 48] slice
    ],
)
def test_gather_block_quantized_matches_onnxruntime(shape, bits, block, zero_points, indices):
    data, scales, zero = quantized_table(shape, bits, block, zero_points)
    inputs = [data, np.array(indices, dtype=np.int64), scales, zero]
    model = ms_model(
        "GatherBlockQuantized", inputs, constant=(0, 2, 3), bits=bits, block_size=block, quantize_axis=len(shape) - 1
    )
    got, expected = ort_and_converted(model, inputs)
    assert got[0].shape == expected[0].shape == (*np.shape(indices), *shape[1:])
    np.testing.assert_array_equal(got[0], expected[0])  # integer values times one scale: exact


def test_gather_block_quantized_int32_indices_and_trainable_scales():
    data, scales, zero = quantized_table((16, 32), 4, 16, True)
    inputs = [data, np.array([[1, 15]], dtype=np.int32), scales, zero]
    model = ms_model("GatherBlockQuantized", inputs, constant=(0, 3), bits=4, block_size=16)
    got, expected = ort_and_converted(model, inputs)
    np.testing.assert_array_equal(got[0], expected[0])

    module = GatherBlockQuantized(4, 16, ("GatherBlockQuantized node 'n'", "input 'ids'"))
    scales64 = torch.from_numpy(scales).double().requires_grad_()
    ids = torch.tensor([[1, 15, 1]])
    gathered = module(torch.from_numpy(data), ids, scales64, torch.from_numpy(zero))
    gathered.pow(2).sum().backward()
    reference = scales64.detach().clone().requires_grad_()
    table = dequantize_rows(torch.from_numpy(data), reference, torch.from_numpy(zero), 4, 16)
    table[ids].pow(2).sum().backward()
    assert scales64.grad is not None and reference.grad is not None
    torch.testing.assert_close(scales64.grad, reference.grad, rtol=1e-12, atol=0)
    assert scales64.grad[0].abs().sum() == 0 and scales64.grad[1].abs().sum() > 0  # only the gathered rows


def test_gather_block_quantized_out_of_range_index_raises_naming_the_input():
    data, scales, _ = quantized_table((16, 32), 4, 16, False)
    inputs = [data, np.array([[2, 16]], dtype=np.int64), scales, None]
    model = ms_model("GatherBlockQuantized", inputs, constant=(0, 2), bits=4, block_size=16)
    gm, tensors = convert_model(model, inputs)
    with pytest.raises(IndexRangeError, match=r"GatherBlockQuantized.*in1.*16"):  # onnxruntime writes zeros
        gm(*tensors)


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"bits": 3}, "bits=3 is not supported"),
        ({"block_size": 24}, "block_size must be a power of 2"),
        ({"gather_axis": 1, "quantize_axis": 0}, "gather_axis 0 and quantize_axis the last"),
    ],
)
def test_gather_block_quantized_unsupported_attributes_raise(attrs, message):
    data, scales, _ = quantized_table((16, 32), 4, 16, False)
    inputs = [data, np.array([1], dtype=np.int64), scales, None]
    model = ms_model("GatherBlockQuantized", inputs, constant=(0, 2), **{"block_size": 16, **attrs})
    with pytest.raises((NotImplementedError, ValueError), match=message):
        convert_model(model, inputs)


def test_gather_block_quantized_scales_of_another_shape_raise():
    data, scales, _ = quantized_table((16, 32), 4, 16, False)
    module = GatherBlockQuantized(4, 16, ("GatherBlockQuantized node 'n'", "input 'ids'"))
    with pytest.raises(ValueError, match=r"scales have shape \[16, 4\], expected \[16, 2\]"):
        module(torch.from_numpy(data), torch.tensor([1]), torch.from_numpy(np.tile(scales, 2)))
