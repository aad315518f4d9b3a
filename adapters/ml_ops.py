"""ML and text-feature ops with a torch form: Binarizer, ArrayFeatureExtractor (ai.onnx.ml), TfIdfVectorizer."""

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


class TfIdfVectorizer(torch.nn.Module):
    """ONNX TfIdfVectorizer over int64 tokens: counts of the pool's n-grams (with skips) per row, weighted
    as TF, IDF or TFIDF. Counted on the host: integer bookkeeping, no gradient."""

    def __init__(self, attrs: dict):
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
                    self.grams[tuple(pool[first:first + size])] = self.columns[index]
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
                    yield tuple(row[start:last + 1:distance])
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
def tfidf_vectorizer(node, graph, context: ConversionContext):
    attrs = attributes(node)
    if "pool_strings" in attrs:
        raise NotImplementedError("TfIdfVectorizer: pool_strings (string tokens) has no torch form; int64 pools do")
    return result(TfIdfVectorizer(attrs), node)
