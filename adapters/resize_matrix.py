"""Resize as one interpolation matrix per axis: cubic, antialiased and tf_crop_and_resize resizes.

Each output position gets ONNX's coefficients over its nearest input positions (edge-padded,
optionally excluding the outside); the matrices apply innermost axis first, so extrapolated
positions of tf_crop_and_resize take ``extrapolation_value`` as ONNX's recursive definition does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import nn


def _coefficients(ratio: float, scale: float, mode: str, attrs: dict) -> list[float]:
    """ONNX's per-tap weights for a source position ``ratio`` past its floor (1 when on a sample)."""
    if mode == "nearest":
        if float(ratio).is_integer():
            return [0.0, 1.0]
        rule = attrs.get("nearest_mode", "round_prefer_floor")
        first = {"round_prefer_floor": ratio <= 0.5, "round_prefer_ceil": ratio < 0.5, "floor": True, "ceil": False}[
            rule
        ]
        return [float(first), float(not first)]
    a = attrs.get("cubic_coeff_a", -0.75)
    if not attrs.get("antialias", 0):
        if mode == "linear":
            return [1 - ratio, ratio]
        r, s = ratio, 1 - ratio
        return [
            ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * s - (a + 3)) * s * s + 1,
            ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
        ]
    scale = min(scale, 1.0)
    if mode == "linear":
        start = math.floor(-1 / scale) + 1
        weights = [min(max(1 - abs((i - ratio) * scale), 0.0), 1.0) for i in range(start, 2 - start)]
    else:
        start = math.floor(-2 / scale) + 1
        weights = [_cubic_kernel(scale * (i - ratio), a) for i in range(start, 2 - start)]
    total = sum(weights)
    return [w / total for w in weights]


def _cubic_kernel(x: float, a: float) -> float:
    x = abs(x)
    if x <= 1:
        return (a + 2) * x**3 - (a + 3) * x**2 + 1
    return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a if x < 2 else 0.0


def _source(x: int, size: int, out: int, scale: float, mode: str, roi: tuple[float, float]) -> float:
    width = scale * size
    if mode == "align_corners":
        return 0.0 if width == 1 else x * (size - 1) / (width - 1)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        span = (roi[1] - roi[0]) * (size - 1)
        return (span / 2 if width == 1 else x * span / (width - 1)) + roi[0] * (size - 1)
    if mode == "pytorch_half_pixel":
        return -0.5 if width == 1 else (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        return size / 2 * (1 - out / width) + (x + 0.5) / scale - 0.5
    return (x + 0.5) / scale - 0.5


@lru_cache(maxsize=64)
def axis_matrix(size: int, out: int, scale: float, roi: tuple[float, float], attrs: tuple) -> tuple:
    """``(matrix [out, size] float64, outside [out] bool or None where no output lies outside)`` for one axis."""
    options = dict(attrs)
    mode, coordinates = options.get("mode", "nearest"), options.get("coordinate_transformation_mode", "half_pixel")
    # Python numbers, not tensors: torch.compile traces this as constants, with no tensor value read
    matrix, outside = [[0.0] * size for _ in range(out)], [False] * out
    for x in range(out):
        origin = _source(x, size, out, scale, coordinates, roi)
        if coordinates == "tf_crop_and_resize" and not 0 <= origin <= size - 1:
            outside[x] = True
            continue
        ratio = 1.0 if float(origin).is_integer() else origin - math.floor(origin)
        weights = _coefficients(ratio, scale, mode, options)
        pad = math.ceil(len(weights) / 2)
        low, high = math.floor(origin) - len(weights) - 1, math.floor(origin) + len(weights) + 2
        candidates = [i for i in range(max(low, -pad), min(high, size + pad))]
        taps = sorted(sorted(candidates, key=lambda i: (abs(origin - i), i))[: len(weights)])
        if options.get("exclude_outside", 0):
            weights = [w if 0 <= i < size else 0.0 for w, i in zip(weights, taps)]
            weights = [w / sum(weights) for w in weights]
        for weight, tap in zip(weights, taps):
            matrix[x][min(max(tap, 0), size - 1)] += weight
    return torch.tensor(matrix, dtype=torch.float64), (torch.tensor(outside) if any(outside) else None)


class MatrixResize(nn.Module):
    """Resize by per-axis matrices built from the roi and scales/sizes (cached per value). ``constants``:
    the roi and the scales/sizes the conversion read as Python numbers (None: each read at run time)."""

    def __init__(
        self,
        axes: list[int],
        attrs: dict,
        sizes: bool,
        targets: Callable[..., tuple],
        constants: tuple[list[float] | None, list[float] | None] = (None, None),
    ) -> None:
        super().__init__()
        self.axes, self.sizes, self.targets, self.options = axes, sizes, targets, attrs
        self.constant_roi, self.constant_target = constants
        self.attrs = tuple(sorted((k, v) for k, v in attrs.items() if isinstance(v, (int, float, str))))
        self.extrapolation = float(attrs.get("extrapolation_value", 0.0))

    def forward(
        self, x: torch.Tensor, roi: torch.Tensor | None = None, target: torch.Tensor | None = None
    ) -> torch.Tensor:
        read = self.constant_target if self.constant_target is not None else target
        values = (None, read) if self.sizes else (read, None)
        scales, sizes = self.targets(*values, tuple(x.shape), self.axes, self.options)
        dtype = x.dtype
        x = x if x.is_floating_point() else x.double()
        bounds = self.constant_roi if self.constant_roi is not None else _roi_bounds(roi)
        count = len(bounds) // 2
        for i in reversed(range(len(self.axes))):
            axis = self.axes[i]
            position = axis if count == x.dim() else i
            box = (bounds[position], bounds[position + count]) if bounds else (0.0, 1.0)
            matrix, outside = axis_matrix(x.shape[axis], sizes[i], scales[i], box, self.attrs)
            moved = torch.movedim(x, axis, -1)
            moved = moved @ matrix.to(x.device, x.dtype).T
            if outside is not None:  # known when the matrix is built: no branch on a tensor's value
                moved = moved.masked_fill(outside.to(x.device), self.extrapolation)
            x = torch.movedim(moved, -1, axis)
        return x if x.dtype == dtype else x.round().to(dtype)


def _roi_bounds(roi: torch.Tensor | None) -> list[float]:
    return roi.tolist() if roi is not None and roi.numel() else []
