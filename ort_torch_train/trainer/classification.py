"""Classification metrics over the whole eval set: precision, recall, F1 (from the predicted classes)
and AUROC (from the scores), as scikit-learn computes them.

The model's output is the eval model's second output (the logits), the target the last input. One
logit per sample, or two classes, is a binary task: the positive class is 1 (a logit above 0, or
class 1's). More classes give the unweighted mean over the classes (scikit-learn's
``average="macro"``; for AUROC one class against the rest, on the softmax). A ratio whose
denominator is zero counts as 0, as scikit-learn's default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ort_torch_train.errors import ModelError
from ort_torch_train.trainer.metric_base import Metric, Outputs


def class_scores(
    name: str, outputs: Outputs, batch: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(scores, predicted, labels, classes): per-class probabilities [N, C] for C > 2 classes, else the
    positive class's score [N]; the predicted classes and the labels as int64 [N]; the class count (2 for
    a binary task)."""
    if len(outputs) < 2:
        raise ModelError(
            f"{name} needs the model's logits, but the eval model outputs only its loss: generate the artifacts "
            "with additional_output_names=['logits'] (the CLI adds them itself)"
        )
    logits, labels = outputs[1].detach().float(), batch[-1].to(outputs[1].device)
    if labels.is_floating_point() and not bool((labels == labels.round()).all()):
        raise ModelError(
            f"{name} compares predicted classes with class labels, but the labels (the last input, {labels.dtype}) "
            "hold fractions: a regression target; use --metric mae, rmse or r2"
        )
    labels = labels.reshape(-1).long()
    if logits.ndim >= 2 and logits.shape[-1] > 1 and logits.numel() == labels.numel() * logits.shape[-1]:
        classes = int(logits.shape[-1])
        probabilities = torch.softmax(logits.reshape(-1, classes), dim=-1)
        scores = probabilities[:, 1] if classes == 2 else probabilities
        predicted = probabilities.argmax(-1)
    elif logits.numel() == labels.numel():
        classes, scores = 2, logits.reshape(-1)
        predicted = (scores > 0).long()
    else:
        raise ModelError(
            f"{name} needs one logit per class or one per sample, but the model's output is {list(logits.shape)} "
            f"and the labels {list(batch[-1].shape)}"
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ModelError(
            f"{name}: expected class labels from 0 to {classes - 1} (the model's output has {classes} classes), "
            f"got labels from {int(labels.min())} to {int(labels.max())}"
        )
    return scores, predicted, labels, classes


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator / denominator, 0 where the denominator is 0."""
    return torch.where(denominator > 0, numerator / denominator.clamp(min=1), torch.zeros_like(numerator))


class ConfusionMetric(Metric):
    """A metric of the confusion matrix of predicted against true classes, summed over the eval set."""

    higher_is_better = True

    def reset(self) -> None:
        """Forget the batches seen."""
        super().reset()
        self.confusion: torch.Tensor | None = None  # [true class, predicted class] counts

    def update(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> None:
        """Add one eval batch."""
        _, predicted, labels, classes = class_scores(self.name, outputs, batch)
        counts = torch.bincount(labels * classes + predicted, minlength=classes * classes)
        counts = counts.reshape(classes, classes).cpu().double()
        if self.confusion is not None and self.confusion.shape != counts.shape:
            raise ModelError(f"{self.name}: the model's class count changed between eval batches")
        self.confusion = counts if self.confusion is None else self.confusion + counts
        self.count += labels.numel()

    def compute(self) -> float:
        """The metric of the positive class (binary) or the mean over the classes seen (macro)."""
        if self.confusion is None or not self.count:
            return math.nan
        true_positives = self.confusion.diagonal()
        per_class = self.per_class(true_positives, self.confusion.sum(0), self.confusion.sum(1))
        if len(per_class) == 2:
            return float(per_class[1])
        seen = (self.confusion.sum(0) + self.confusion.sum(1)) > 0  # in the labels or the predictions
        return float(per_class[seen].mean())

    def per_class(self, true_positives: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
        """The metric of each class from its true positives, predicted count and actual count."""
        raise NotImplementedError


class Precision(ConfusionMetric):
    """Of the samples predicted as a class, the share that belong to it."""

    name = "precision"

    def per_class(self, true_positives: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
        """true positives / predicted."""
        return _ratio(true_positives, predicted)


class Recall(ConfusionMetric):
    """Of the samples of a class, the share predicted as it."""

    name = "recall"

    def per_class(self, true_positives: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
        """true positives / actual."""
        return _ratio(true_positives, actual)


class F1Score(ConfusionMetric):
    """The harmonic mean of precision and recall."""

    name = "f1"

    def per_class(self, true_positives: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
        """2 true positives / (predicted + actual)."""
        return _ratio(2 * true_positives, predicted + actual)


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    """The 1-based rank of each value, tied values sharing their mean rank."""
    ordered, order = values.sort()
    _, group, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = torch.empty(values.shape, dtype=torch.float64)
    ranks[order] = (ends - (counts.double() - 1) / 2)[group]
    return ranks


def _binary_auroc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """The area under the ROC curve (the chance that a positive outranks a negative; NaN without both)."""
    positives = int(positive.sum())
    negatives = positive.numel() - positives
    if not positives or not negatives:
        return math.nan
    rank_sum = float(_average_ranks(scores.double())[positive].sum())
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


class AUROC(Metric):
    """The area under the ROC curve: binary, or one class against the rest averaged over the classes in
    the labels (NaN when the labels hold one class only)."""

    name = "auroc"
    higher_is_better = True

    def reset(self) -> None:
        """Forget the batches seen."""
        super().reset()
        self.scores: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    def update(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> None:
        """Add one eval batch."""
        scores, _, labels, _ = class_scores(self.name, outputs, batch)
        self.scores.append(scores.cpu())
        self.labels.append(labels.cpu())
        self.count += labels.numel()

    def compute(self) -> float:
        """The area over every batch since ``reset()``."""
        if not self.count:
            return math.nan
        scores, labels = torch.cat(self.scores), torch.cat(self.labels)
        if scores.ndim == 1:
            return _binary_auroc(scores, labels == 1)
        present = labels.unique().tolist()
        if len(present) < 2:
            return math.nan
        return sum(_binary_auroc(scores[:, label], labels == label) for label in present) / len(present)
