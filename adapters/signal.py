"""Signal processing: DFT, STFT, Hann/Hamming/Blackman windows, MelWeightMatrix (torch.fft underneath)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ort_torch_train.dtypes import torch_dtype

from .common import Inline, OperationConverterResult, attributes, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def _complex(x: torch.Tensor) -> torch.Tensor:
    """ONNX's signal layout (``[..., 1]`` real or ``[..., 2]`` real/imaginary) as a (complex) tensor."""
    return x[..., 0] if x.shape[-1] == 1 else torch.complex(x[..., 0], x[..., 1])


def dft(
    x: torch.Tensor, length: torch.Tensor | None = None, axis: torch.Tensor | int = 1, *, inverse: bool, onesided: bool
) -> torch.Tensor:
    """ONNX DFT along ``axis`` (an int or a scalar tensor read at run time)."""
    axis = int(axis) % x.dim()
    if length is None:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    else:
        n = int(length)
    signal = _complex(x)
    if inverse and onesided:
        return torch.fft.irfft(signal, n, dim=axis).unsqueeze(-1).to(x.dtype)
    if inverse:
        out = torch.fft.ifft(signal, n, dim=axis)
    else:
        out = torch.fft.fft(signal, n, dim=axis)
        if onesided:
            out = out.narrow(axis, 0, n // 2 + 1)
    return torch.view_as_real(out).to(x.dtype)


class DFT(torch.nn.Module):
    """Module form: ``dft_length`` and (opset 20) ``axis`` are optional inputs."""

    def __init__(self, axis: int, inverse: bool, onesided: bool) -> None:
        super().__init__()
        self.axis, self.inverse, self.onesided = axis, inverse, onesided

    def forward(
        self, x: torch.Tensor, dft_length: torch.Tensor | None = None, axis: torch.Tensor | None = None
    ) -> torch.Tensor:
        return dft(x, dft_length, self.axis if axis is None else axis, inverse=self.inverse, onesided=self.onesided)


@register("DFT", since=17, shape_inputs=(1, 2))
def dft_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    axis = attrs.get("axis", 1 if context.opset < 20 else -2)
    return result(DFT(axis, bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))), node)


def stft(
    signal: torch.Tensor,
    frame_step: torch.Tensor,
    window: torch.Tensor | None = None,
    frame_length: torch.Tensor | None = None,
    *,
    onesided: bool,
) -> torch.Tensor:
    """ONNX STFT: windowed frames of ``signal`` ``[batch, length, 1 or 2]``, each transformed by a DFT."""
    if frame_length is not None:
        length = int(frame_length)
    else:
        length = window.shape[0] if window is not None else signal.shape[-2]
    frames = signal.unfold(1, length, int(frame_step)).transpose(-1, -2)  # [batch, frames, length, 1 or 2]
    if window is not None:
        frames = frames * window.reshape(-1, 1)
    return dft(frames, None, 2, inverse=False, onesided=onesided)


class STFT(torch.nn.Module):
    """Module form: ``window`` and ``frame_length`` are optional inputs."""

    def __init__(self, onesided: bool) -> None:
        super().__init__()
        self.onesided = onesided

    def forward(
        self,
        signal: torch.Tensor,
        frame_step: torch.Tensor,
        window: torch.Tensor | None = None,
        frame_length: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return stft(signal, frame_step, window, frame_length, onesided=self.onesided)


@register("STFT", since=17, shape_inputs=(1, 3))
def stft_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(STFT(bool(attributes(node).get("onesided", 1))), node)


def _window_positions(size: torch.Tensor, periodic: bool) -> tuple[torch.Tensor, int]:
    """Positions ``0..size-1`` (float64) and the span the window's period divides by."""
    n = int(size)
    return torch.arange(n, dtype=torch.float64), (n if periodic else n - 1)


def hann_window(size: torch.Tensor, periodic: bool, dtype: torch.dtype) -> torch.Tensor:
    positions, span = _window_positions(size, periodic)
    return torch.sin(positions * math.pi / span).pow(2).to(dtype)


def hamming_window(size: torch.Tensor, periodic: bool, dtype: torch.dtype) -> torch.Tensor:
    positions, span = _window_positions(size, periodic)
    alpha = 25.0 / 46.0
    return (alpha - (1.0 - alpha) * torch.cos(positions * 2 * math.pi / span)).to(dtype)


def blackman_window(size: torch.Tensor, periodic: bool, dtype: torch.dtype) -> torch.Tensor:
    positions, span = _window_positions(size, periodic)
    angle = positions * 2 * math.pi / span
    return (0.42 - 0.5 * torch.cos(angle) + 0.08 * torch.cos(2 * angle)).to(dtype)


def _window(function):
    def convert(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
        attrs = attributes(node)
        dtype = torch_dtype(attrs.get("output_datatype", 1))
        return result(Inline(function, bool(attrs.get("periodic", 1)), dtype), node)

    return convert


register("HannWindow", since=17, shape_inputs=(0,))(_window(hann_window))
register("HammingWindow", since=17, shape_inputs=(0,))(_window(hamming_window))
register("BlackmanWindow", since=17, shape_inputs=(0,))(_window(blackman_window))


def mel_weight_matrix(
    bins: torch.Tensor | int,
    dft_length: torch.Tensor | int,
    sample_rate: torch.Tensor | int,
    lower: torch.Tensor,
    upper: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """ONNX MelWeightMatrix ``[dft_length // 2 + 1, bins]``: triangular filters on the mel scale."""
    bins, dft_length, sample_rate = int(bins), int(dft_length), int(sample_rate)
    low_mel = 2595 * math.log1p(float(lower) / 700) / math.log(10)
    high_mel = 2595 * math.log1p(float(upper) / 700) / math.log(10)
    step = (high_mel - low_mel) / (bins + 2)
    edges = [
        int(((dft_length + 1) * (700 * math.expm1((i * step + low_mel) / 2595 * math.log(10)))) // sample_rate)
        for i in range(bins + 2)
    ]
    out = torch.zeros(dft_length // 2 + 1, bins, dtype=torch.float64)
    for i in range(bins):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return out.to(dtype)


@register("MelWeightMatrix", since=17, shape_inputs=(0, 1))
def mel_weight_matrix_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(mel_weight_matrix, torch_dtype(attributes(node).get("output_datatype", 1))), node)
