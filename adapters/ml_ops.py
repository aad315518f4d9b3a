"""ai.onnx.ml ops with a torch equivalent: Binarizer, ArrayFeatureExtractor."""

from __future__ import annotations

import torch

from .common import Inline, attributes, result
from .registry import ConversionContext, register

ML = "ai.onnx.ml"


def binarize(x: torch.Tensor, threshold: float) -> torch.Tensor:
    return (x > threshold).to(x.dtype)


def extract_features(data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``data[..., indices]`` with the indices flattened (a vector ``data`` gives one row, as in ORT)."""
    picked = data.index_select(-1, indices.reshape(-1).to(torch.int64))
    return picked.reshape(1, -1) if data.dim() == 1 else picked


@register("Binarizer", domain=ML)
def binarizer(node, graph, context: ConversionContext):
    return result(Inline(binarize, float(attributes(node).get("threshold", 0.0))), node)


@register("ArrayFeatureExtractor", domain=ML)
def array_feature_extractor(node, graph, context: ConversionContext):
    return result(Inline(extract_features), node)
