"""Loss operators: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (ONNX and ORT-internal)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .common import OperationConverterResult, attributes, compiling_ahead, constant_input, result
from .lean_cross_entropy import LeanSoftmaxCrossEntropy, pays_for
from .registry import MICROSOFT, ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_TORCH_DEFAULT_IGNORE = -100


class NegativeLogLikelihood(nn.Module):
    """ONNX NegativeLogLikelihoodLoss on log-probabilities, optionally from raw scores."""

    def __init__(
        self, reduction: str, ignore_index: int | None, from_scores: bool, labels_name: str, lean: bool = False
    ) -> None:
        super().__init__()
        self.reduction = reduction
        self.ignore_index = _TORCH_DEFAULT_IGNORE if ignore_index is None else ignore_index
        self.from_scores = from_scores
        self.labels_name = labels_name
        self.lean = lean  # scores in, log-probabilities never read: LeanSoftmaxCrossEntropy (eager, unweighted)

    def forward(
        self, scores: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        traced = compiling_ahead()
        # the lean loss checks its labels on the host and loops over the scores' sizes: eager only
        if self.lean and weight is None and not traced and pays_for(scores):
            try:
                loss = LeanSoftmaxCrossEntropy.apply(scores, labels, self.ignore_index, self.reduction)
            except IndexError as error:
                raise self._label_error(labels, scores.shape[1]) from error
            return loss, None  # the log-probabilities output is read by no node
        log_prob = torch.log_softmax(scores, dim=1) if self.from_scores else scores
        if traced:  # no host check of the labels
            loss = self._loss(log_prob, labels, weight)
        else:
            try:  # torch's CPU kernel checks the labels; its error does not name the input
                loss = self._loss(log_prob, labels, weight)
            except IndexError as error:
                raise self._label_error(labels, scores.shape[1]) from error
        return (loss, log_prob) if self.from_scores else loss

    def _loss(self, log_prob: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        labels = labels.long()
        if weight is None:
            return F.nll_loss(log_prob, labels, ignore_index=self.ignore_index, reduction=self.reduction)
        # weighted by hand: torch's nll_loss has no gradient w.r.t. its weight
        picked = F.nll_loss(log_prob, labels, ignore_index=self.ignore_index, reduction="none")
        valid = labels != self.ignore_index
        weights = weight[torch.where(valid, labels, 0)] * valid
        loss = picked * weights
        if self.reduction == "none":
            return loss
        return loss.sum() if self.reduction == "sum" else loss.sum() / weights.sum()

    def _label_error(self, labels: torch.Tensor, classes: int) -> IndexError:
        bad = ((labels < 0) | (labels >= classes)) & (labels != self.ignore_index)
        value = int(labels[bad].flatten()[0]) if bool(bad.any()) else "unknown"
        return IndexError(
            f"input {self.labels_name!r}: class index {value} is out of range, expected 0 <= label < {classes}"
            + ("" if self.ignore_index == _TORCH_DEFAULT_IGNORE else f" or ignore_index {self.ignore_index}")
        )


def _ignore_index(node: OnnxNode, graph: OnnxGraph) -> int | None:
    if len(node.input_values) > 3 and node.input_values[3]:  # ORT's internal ops take it as an input
        return int(constant_input(node, graph, 3).item())
    return attributes(node).get("ignore_index")


def _read(name: str, graph: OnnxGraph) -> bool:
    """Whether a node or the graph's outputs read value ``name``."""
    return name in graph.output_values or any(name in node.input_values for node in graph.nodes.values())


def _convert(node: OnnxNode, graph: OnnxGraph, from_scores: bool):
    attrs = attributes(node)
    reduction = attrs.get("reduction", "mean")
    log_prob_read = len(node.output_values) > 1 and bool(node.output_values[1]) and _read(node.output_values[1], graph)
    module = NegativeLogLikelihood(
        reduction=reduction,
        ignore_index=_ignore_index(node, graph),
        from_scores=from_scores,
        labels_name=node.input_values[1],
        lean=from_scores and not log_prob_read and reduction in ("mean", "sum"),
    )
    return result(module, node, node.input_values[:3])


@register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return _convert(node, graph, from_scores=True)


@register("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return _convert(node, graph, from_scores=False)


@register("SoftmaxCrossEntropyLossInternal", domain=MICROSOFT)
def softmax_cross_entropy_internal(
    node: OnnxNode, graph: OnnxGraph, context: ConversionContext
) -> OperationConverterResult:
    return _convert(node, graph, from_scores=True)


@register("NegativeLogLikelihoodLossInternal", domain=MICROSOFT)
def negative_log_likelihood_internal(
    node: OnnxNode, graph: OnnxGraph, context: ConversionContext
) -> OperationConverterResult:
    return _convert(node, graph, from_scores=False)
