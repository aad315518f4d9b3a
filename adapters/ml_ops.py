"""ML and text-feature ops with a torch form: Binarizer, ArrayFeatureExtractor, TreeEnsemble (ai.onnx.ml), TfIdfVectorizer;
StringSplit, a text op without one, declared with its value-dependent output shape."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .common import Inline, OperationConverterResult, attributes, result
from .index_checks import checked_indices, index_source
from .registry import ConversionContext, declare, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

ML = "ai.onnx.ml"


def binarize(x: torch.Tensor, threshold: float) -> torch.Tensor:
    return (x > threshold).to(x.dtype)


def extract_features(data: torch.Tensor, indices: torch.Tensor, source: tuple[str, str]) -> torch.Tensor:
    """``data[..., indices]`` with the indices flattened (a vector ``data`` gives one row, as in ORT)."""
    picked = data.index_select(-1, checked_indices(indices.reshape(-1), 0, data.shape[-1], *source))
    return picked.reshape(1, -1) if data.dim() == 1 else picked


@register("Binarizer", domain=ML)
def binarizer(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(binarize, float(attributes(node).get("threshold", 0.0))), node)


@register("ArrayFeatureExtractor", domain=ML)
def array_feature_extractor(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(extract_features, index_source(node, 1)), node)


class TfIdfVectorizer(torch.nn.Module):
    """ONNX TfIdfVectorizer over int64 tokens: counts of the pool's n-grams (with skips) per row, weighted
    as TF, IDF or TFIDF. Counted on the host: integer bookkeeping, no gradient."""

    def __init__(self, attrs: dict) -> None:
        super().__init__()
        self.min_size, self.max_size = attrs["min_gram_length"], attrs["max_gram_length"]
        self.max_skip, self.mode = attrs["max_skip_count"], attrs["mode"]
        self.columns, self.weights = list(attrs["ngram_indexes"]), list(attrs.get("weights", []))
        self.width = max(self.columns) + 1
        pool, starts = list(attrs["pool_int64s"]), list(attrs["ngram_counts"])
        self.grams: dict[tuple[int, ...], int] = {}
        index = 0
        for size, start in enumerate(starts, start=1):
            end = starts[size] if size < len(starts) else len(pool)
            for first in range(start, end, size):
                if self.min_size <= size <= self.max_size:
                    self.grams[tuple(pool[first : first + size])] = self.columns[index]
                index += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(1, -1).tolist() if x.dim() < 2 else x.tolist()
        counts = torch.zeros(len(rows), self.width, dtype=torch.float32)
        for row_index, row in enumerate(rows):
            for gram in self._grams_of(row):
                column = self.grams.get(gram)
                if column is not None:
                    counts[row_index, column] += 1
        out = self._weighted(counts)
        return (out.reshape(-1) if x.dim() < 2 else out).to(x.device)

    def _grams_of(self, row: list[int]):
        """Every n-gram of allowed size and skip in ``row`` (unigrams once, not once per skip)."""
        smallest = self.min_size
        for distance in range(1, self.max_skip + 2):
            for start in range(len(row)):
                for size in range(smallest, self.max_size + 1):
                    last = start + (size - 1) * distance
                    if last >= len(row):
                        break
                    yield tuple(row[start : last + 1 : distance])
            if smallest == 1:
                smallest = 2
                if smallest > self.max_size:
                    return

    def _weighted(self, counts: torch.Tensor) -> torch.Tensor:
        weights = torch.tensor(self.weights, dtype=torch.float32) if self.weights else None
        if self.mode == "IDF":
            present = (counts > 0).float()
            return present * weights if weights is not None else present
        if self.mode == "TFIDF" and weights is not None:
            return counts * weights
        return counts


@register("TfIdfVectorizer", since=9)
def tfidf_vectorizer(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    if "pool_strings" in attrs:
        raise NotImplementedError("TfIdfVectorizer: pool_strings (string tokens) has no torch form; int64 pools do")
    return result(TfIdfVectorizer(attrs), node)


_COMPARE = {
    0: lambda v, s: v <= s,
    1: lambda v, s: v < s,
    2: lambda v, s: v >= s,
    3: lambda v, s: v > s,
    4: lambda v, s: v == s,
    5: lambda v, s: v != s,
    6: lambda v, s: v in s,
}


class TreeEnsemble(torch.nn.Module):
    """ai.onnx.ml TreeEnsemble (opset 5): each tree sends a row to one leaf; leaf weights are summed,
    averaged, or min/max-ed per target. Walked on the host: trees have no gradient."""

    def __init__(self, attrs: dict) -> None:
        super().__init__()
        attrs = self.attrs = {
            name: _values(value) if hasattr(value, "to_torch") else value for name, value in attrs.items()
        }
        self.splits = [float(v) for v in attrs["nodes_splits"]]
        self.weights = [float(v) for v in attrs["leaf_weights"]]
        members = [float(v) for v in attrs.get("membership_values", [])]
        self.members: dict[int, set[float]] = {}
        for node, mode in enumerate(attrs["nodes_modes"]):
            if mode == 6:  # a NaN-terminated run of member values per set-membership node
                end = next(i for i, v in enumerate(members) if math.isnan(v))
                self.members[node], members = set(members[:end]), members[end + 1 :]
        self.aggregate, self.targets = attrs.get("aggregate_function", 1), attrs["n_targets"]

    def _leaf(self, row: list[float], root: int) -> int:
        a = self.attrs
        node, leaf = (
            root,
            bool(
                a["nodes_trueleafs"][root]
                and a["nodes_falseleafs"][root]
                and a["nodes_truenodeids"][root] == a["nodes_falsenodeids"][root]
            ),
        )
        while not leaf:
            value = row[a["nodes_featureids"][node]]
            split = self.members.get(node, self.splits[node])
            missing = bool(a.get("nodes_missing_value_tracks_true", [0] * (node + 1))[node]) and math.isnan(value)
            branch = "true" if missing or _COMPARE[a["nodes_modes"][node]](value, split) else "false"
            node, leaf = a[f"nodes_{branch}nodeids"][node], bool(a[f"nodes_{branch}leafs"][node])
        return node

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        roots, targets = self.attrs["tree_roots"], self.attrs["leaf_targetids"]
        initial = {1: 0.0, 0: 0.0, 2: math.inf, 3: -math.inf}[self.aggregate]
        rows = []
        for row in x.tolist():
            out = [initial] * self.targets
            for root in roots:
                leaf = self._leaf(row, root)
                target, weight = targets[leaf], self.weights[leaf]
                if self.aggregate in (0, 1):
                    out[target] += weight / len(roots) if self.aggregate == 0 else weight
                else:
                    out[target] = (min if self.aggregate == 2 else max)(out[target], weight)
            rows.append(out)
        return torch.tensor(rows, dtype=x.dtype, device=x.device)


def _values(tensor) -> list:
    """A tensor attribute's values as a flat list."""
    return tensor.to_torch().reshape(-1).tolist()


@register("TreeEnsemble", domain=ML, since=5)
def tree_ensemble(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    if attrs.get("post_transform", 0):
        raise NotImplementedError("TreeEnsemble: post_transform other than NONE is not supported")
    return result(TreeEnsemble(attrs), node)


declare("StringSplit", data_dependent_shape=True)
