"""The metric interface of the eval loop (``Metric``: ``reset``, ``update(outputs, batch)``, ``compute``),
and ``TorchMetric``, which lets a metric of the torchmetrics kind (``update(preds, target)``,
``compute``, ``reset``) stand where a metric is named."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from ort_torch_train.errors import InputError, ModelError

Outputs = Sequence[torch.Tensor]


class Metric:
    """One number over the eval set: ``reset()``, ``update(outputs, batch)`` per batch, ``compute()``."""

    name = "metric"
    higher_is_better = False

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def reset(self) -> None:
        """Forget the batches seen."""
        self.total = 0.0
        self.count = 0

    def update(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> None:
        """Add one eval batch."""
        rows = int(batch[0].shape[0]) if batch and batch[0].ndim else 1
        self.total += self.batch_value(outputs, batch) * rows
        self.count += rows

    def batch_value(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> float:
        """The metric of one batch (averaged over batches by their rows)."""
        raise NotImplementedError

    def compute(self) -> float:
        """The metric over every batch since ``reset()``."""
        return self.total / self.count if self.count else math.nan

    def improved(self, value: float, best: float | None) -> bool:
        """Whether ``value`` is better than ``best`` (None: nothing yet)."""
        if best is None or math.isnan(best):
            return not math.isnan(value)
        return value > best if self.higher_is_better else value < best


@runtime_checkable
class StatefulMetric(Protocol):
    """A metric of the torchmetrics kind: ``update(preds, target)`` per batch, ``compute()``, ``reset()``."""

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> object:
        """Add one batch's predictions and targets."""
        ...

    def compute(self) -> object:
        """The value over every batch since ``reset()`` (a number or a one-element tensor)."""
        ...

    def reset(self) -> None:
        """Forget the batches seen."""
        ...


class TorchMetric(Metric):
    """A ``StatefulMetric`` (any ``torchmetrics.Metric``) fed the model's output (the eval model's second
    output, e.g. the logits) and the target (the last input).

    Its name is ``name`` or the metric's class name; larger is better when the metric's
    ``higher_is_better`` says so.

    Args:
        metric: the metric it feeds (a ``torchmetrics.Metric`` or any object with ``update(preds, target)``,
            ``compute()`` and ``reset()``).
        name: the name it reports under (default: the metric's class name).

    Examples:
        ```python
        import torchmetrics
        from ort_torch_train.trainer import TorchMetric

        f1 = TorchMetric(torchmetrics.classification.MulticlassF1Score(num_classes=5), name="f1_macro")
        ```
    """

    def __init__(self, metric: StatefulMetric, name: str | None = None) -> None:
        super().__init__()
        self.metric = metric
        self.name = name or type(metric).__name__
        self.higher_is_better = bool(getattr(metric, "higher_is_better", False))

    def reset(self) -> None:
        """Forget the batches seen."""
        super().reset()
        self.metric.reset()

    def update(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> None:
        """Add one eval batch."""
        if len(outputs) < 2:
            raise ModelError(
                f"{self.name} needs the model's output, but the eval model outputs only its loss: generate the "
                "artifacts with additional_output_names=[...] (the CLI adds them itself)"
            )
        predicted, target = outputs[1].detach(), batch[-1].to(outputs[1].device)
        if predicted.ndim != target.ndim and predicted.numel() == target.numel():
            predicted = predicted.reshape(target.shape)  # one logit per sample: [N, 1] against [N]
        if isinstance(self.metric, torch.nn.Module):
            self.metric.to(predicted.device)
        self.metric.update(predicted, target)
        self.count += int(target.shape[0]) if target.ndim else 1

    def compute(self) -> float:
        """The metric's value over every batch since ``reset()``."""
        if not self.count:
            return math.nan
        value = self.metric.compute()
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ModelError(
                    f"{self.name}: expected one number from compute(), got a tensor of shape {list(value.shape)} "
                    "(give the metric an average, e.g. average='macro')"
                )
            return float(value.item())
        return float(value)  # type: ignore[arg-type]


def as_metric(metric: Metric | StatefulMetric) -> Metric:
    """``metric`` itself, or a ``StatefulMetric`` (a torchmetrics metric) wrapped in ``TorchMetric``."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, StatefulMetric):
        return TorchMetric(metric)
    raise InputError(
        f"metric: expected a name, a Metric or an object with update(preds, target), compute() and reset() "
        f"(a torchmetrics.Metric), got {type(metric).__name__}"
    )
