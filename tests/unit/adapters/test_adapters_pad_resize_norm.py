"""Pad, Resize, GroupNormalization, RMSNormalization."""

import numpy as np
import pytest

from tests.helpers.adapter_harness import check, check_dynamic, check_gradients, rand

I64 = np.int64


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 0, 1, 2, 0, 0, 2, 1], [0, 1, 0, 0, 0, 0, 1, 1], [0, 0, -1, 1, 0, 0, 1, -2]])
def test_pad(mode, pads):
    x = rand(2, 3, 4, 5)
    reference = "ort" if min(pads) < 0 else "onnx"  # onnx.reference rejects negative pads (crops)
    if reference == "onnx":  # onnxruntime has no Pad-2
        check("Pad", [x], opset=2, mode=mode, pads=pads, **({"value": 1.5} if mode == "constant" else {}))
    inputs = [x, np.array(pads, I64)] + ([np.array(1.5, np.float32)] if mode == "constant" else [])
    check("Pad", inputs, constant=[1, 2], opset=13, mode=mode, reference=reference)
    check_dynamic("Pad", inputs, opset=13, mode=mode, reference=reference)
    check_gradients("Pad", inputs, constant=[1, 2], opset=13, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("axes", [[1], [-1, 0], [2, 3]])
def test_pad_axes(mode, axes):
    x = rand(3, 4, 3, 4)
    pads = np.array([1] * len(axes) + [2] * len(axes), I64)
    opset = 19 if mode == "wrap" else 18
    check("Pad", [x, pads, None, np.array(axes, I64)], constant=[1, 3], opset=opset, mode=mode)
    check_dynamic("Pad", [x, pads, None, np.array(axes, I64)], opset=opset, mode=mode)


def test_pad_integers():
    check("Pad", [rand(3, 4, dtype=np.int64), np.array([1, 0, 0, 2], I64), np.array(7, I64)], constant=[1, 2], opset=13)


RESIZES = [
    ({"mode": "nearest"}, [1, 1, 2, 2], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, None, [2, 3, 8, 15]),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 1.7, 0.6], None),
    (
        {"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "align_corners"},
        None,
        [2, 3, 7, 4],
    ),
    ({"mode": "linear"}, [1, 1, 2, 2], None),
    ({"mode": "linear"}, [1, 1, 1.5, 0.5], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 9, 7]),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 2, 3], None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [2, 3, 1, 7]),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 1.7, 2.2], None),
]


@pytest.mark.parametrize("attrs, scales, sizes", RESIZES)
@pytest.mark.parametrize("opset", [13, 18, 19])
def test_resize(attrs, scales, sizes, opset):
    if attrs.get("coordinate_transformation_mode") == "half_pixel_symmetric" and opset < 19:
        pytest.skip("half_pixel_symmetric is new in opset 19")
    x = rand(2, 3, 4, 5)
    inputs = [
        x,
        None,
        None if scales is None else np.array(scales, np.float32),
        None if sizes is None else np.array(sizes, I64),
    ]
    while inputs[-1] is None:
        inputs.pop()
    check("Resize", inputs, constant=[2, 3], opset=opset, atol=1e-5, **attrs)
    if opset == 19 and scales is not None:
        check_gradients("Resize", [x[:1, :1], *inputs[1:]], constant=[2, 3], opset=opset, **attrs)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_axes_and_aspect_ratio(policy):
    x = rand(2, 3, 4, 5)
    inputs = [x, None, None, np.array([7, 6], I64)]
    check(
        "Resize", inputs, constant=[3], opset=18, atol=1e-5, mode="linear", axes=[3, 2], keep_aspect_ratio_policy=policy
    )


@pytest.mark.slow
@pytest.mark.parametrize("opset, affine_shape", [(18, (2,)), (21, (6,))])
def test_group_normalization(opset, affine_shape):
    inputs = [rand(2, 6, 3, 2), rand(*affine_shape, seed=1), rand(*affine_shape, seed=2)]
    check("GroupNormalization", inputs, opset=opset, atol=1e-5, num_groups=2, epsilon=1e-3)
    check_gradients("GroupNormalization", inputs, opset=opset, num_groups=2)


@pytest.mark.parametrize("axis, scale_shape", [(-1, (4,)), (1, (3, 4)), (1, (1, 4))])
def test_rms_normalization(axis, scale_shape):
    inputs = [rand(2, 3, 4), rand(*scale_shape, seed=1)]
    check("RMSNormalization", inputs, opset=23, atol=1e-5, axis=axis)
    check_gradients("RMSNormalization", inputs, opset=23, axis=axis)
