"""Evaluation metrics over the eval model's outputs: loss, accuracy, perplexity, the classification
metrics f1, precision, recall and auroc, the regression metrics mae, rmse and r2, any torchmetrics
metric, or your own function.

A metric sees each eval batch's outputs (the loss first, then any model outputs such as the logits)
and the batch's inputs (the labels last), and gives one number for the whole eval set.
``metric_named("package.module:function")`` wraps a function ``function(outputs, batch) -> float``
as a metric averaged over the samples (weighted by each batch's rows); give the function an
attribute ``higher_is_better = True`` when larger values are better (default: lower is better).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from ort_torch_train.api.ortvalue import numpy_to_tensor
from ort_torch_train.errors import InputError, ModelError
from ort_torch_train.export.outputs import exportable_output_names
from ort_torch_train.graph.layout import ModelSource, load_model
from ort_torch_train.trainer.batches import model_inputs
from ort_torch_train.trainer.classification import AUROC, F1Score, Precision, Recall
from ort_torch_train.trainer.metric_base import Metric, Outputs, StatefulMetric, TorchMetric
from ort_torch_train.trainer.protocols import EvalModule, NamedInputs


class Loss(Metric):
    """The mean of the eval model's loss (its first output) over the samples."""

    name = "loss"

    def batch_value(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> float:
        """The batch's mean loss."""
        return float(outputs[0].float().mean())


class Perplexity(Loss):
    """``exp`` of the mean loss (for a cross-entropy loss over tokens)."""

    name = "perplexity"

    def compute(self) -> float:
        """``exp(mean loss)``."""
        return math.exp(min(super().compute(), 700.0))


class Accuracy(Metric):
    """The share of samples whose predicted class equals the label (the last input).

    The prediction comes from the eval model's second output (the logits): the argmax of its last
    axis, or ``logit > 0`` for one logit per sample (binary).
    """

    name = "accuracy"
    higher_is_better = True

    def batch_value(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> float:
        """The batch's share of correct predictions."""
        if len(outputs) < 2:
            raise ModelError(
                "accuracy needs the model's logits, but the eval model outputs only its loss: generate the "
                "artifacts with additional_output_names=['logits'] (the CLI adds them itself)"
            )
        logits, labels = outputs[1].detach(), batch[-1].to(outputs[1].device)
        if labels.is_floating_point() and not bool(((labels == 0) | (labels == 1)).all()):
            raise ModelError(
                f"accuracy compares predicted classes with class labels, but the labels (the last input, "
                f"{labels.dtype}) hold values other than 0 and 1: a regression target; use --metric mae, rmse or r2"
            )
        if logits.ndim == labels.ndim + 1 and logits.shape[-1] > 1:
            predicted = logits.argmax(-1)
        else:
            predicted = (logits.reshape(labels.shape) > 0).to(labels.dtype)
        return float((predicted == labels).float().mean())


def _predictions_and_targets(name: str, outputs: Outputs, batch: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The model's output (the eval model's second) and the target (the last input), both flat float64."""
    if len(outputs) < 2:
        raise ModelError(
            f"{name} needs the model's output, but the eval model outputs only its loss: generate the artifacts "
            "with additional_output_names=[...] (the CLI adds them itself)"
        )
    predicted, target = outputs[1].detach(), batch[-1].to(outputs[1].device)
    if predicted.numel() != target.numel():
        raise ModelError(
            f"{name} compares the model's output with the target, but the output is {list(predicted.shape)} and "
            f"the target {list(target.shape)}: a classifier's logits? use --metric accuracy"
        )
    return predicted.reshape(-1).double(), target.reshape(-1).double()


class MeanAbsoluteError(Metric):
    """The mean of |output - target| over the samples (the model's output against the last input)."""

    name = "mae"

    def batch_value(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> float:
        """The batch's mean absolute error."""
        predicted, target = _predictions_and_targets(self.name, outputs, batch)
        return float((predicted - target).abs().mean())


class RootMeanSquaredError(Metric):
    """The square root of the mean squared error over every sample."""

    name = "rmse"

    def batch_value(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> float:
        """The batch's mean squared error (the root is taken over the whole set)."""
        predicted, target = _predictions_and_targets(self.name, outputs, batch)
        return float(((predicted - target) ** 2).mean())

    def compute(self) -> float:
        """``sqrt(mean squared error)``."""
        return math.sqrt(super().compute())


class R2Score(Metric):
    """The coefficient of determination, 1 - SS_res / SS_tot, over every sample (1 is a perfect fit)."""

    name = "r2"
    higher_is_better = True

    def __init__(self) -> None:
        super().__init__()
        self.reset()

    def reset(self) -> None:
        """Forget the batches seen."""
        super().reset()
        self.sums = torch.zeros(3, dtype=torch.float64)  # sum of target, of target², of squared residuals

    def update(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> None:
        """Add one eval batch."""
        predicted, target = _predictions_and_targets(self.name, outputs, batch)
        self.sums += torch.stack([target.sum(), (target**2).sum(), ((predicted - target) ** 2).sum()]).cpu()
        self.count += target.numel()

    def compute(self) -> float:
        """``1 - SS_res / SS_tot`` (NaN for a constant target)."""
        if not self.count:
            return math.nan
        total, squares, residual = (float(value) for value in self.sums)
        spread = squares - total * total / self.count
        return 1.0 - residual / spread if spread > 0 else math.nan


class BatchFunction(Metric):
    """A user function ``function(outputs, batch) -> float`` averaged over the samples."""

    def __init__(self, name: str, function: Callable[[Outputs, Sequence[torch.Tensor]], float]) -> None:
        super().__init__()
        self.name = name
        self.function = function
        self.higher_is_better = bool(getattr(function, "higher_is_better", False))

    def batch_value(self, outputs: Outputs, batch: Sequence[torch.Tensor]) -> float:
        """The function's value on the batch."""
        return float(self.function(outputs, batch))


BUILT_IN: dict[str, type[Metric]] = {
    "loss": Loss,
    "accuracy": Accuracy,
    "perplexity": Perplexity,
    "mae": MeanAbsoluteError,
    "rmse": RootMeanSquaredError,
    "r2": R2Score,
    "f1": F1Score,
    "precision": Precision,
    "recall": Recall,
    "auroc": AUROC,
}


def metric_named(text: str) -> Metric:
    """A built-in metric by name ("loss", "accuracy", "perplexity", "f1", "precision", "recall", "auroc",
    "mae", "rmse", "r2"), or "package.module:function" (a function of (outputs, batch)), or
    "package.module:Class" of a metric that a call without arguments makes (a torchmetrics metric such
    as "torchmetrics.classification:BinaryAUROC")."""
    if text in BUILT_IN:
        return BUILT_IN[text]()
    module_name, colon, function_name = text.partition(":")
    if not colon or not module_name or not function_name:
        raise InputError(f"metric: expected one of {', '.join(BUILT_IN)} or 'package.module:function', got {text!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError(f"metric {text!r}: cannot import {module_name!r} ({error})") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InputError(f"metric {text!r}: {module_name!r} has no function {function_name!r}")
    if isinstance(function, type):
        return _metric_of_class(text, function)
    return BatchFunction(function_name, function)


def _metric_of_class(text: str, cls: type) -> Metric:
    """An instance of the metric class ``cls`` made without arguments."""
    try:
        instance = cls()
    except (TypeError, ValueError) as error:
        raise InputError(
            f"metric {text!r}: {cls.__name__}() needs arguments ({error}); build it in Python and pass the object"
        ) from error
    if isinstance(instance, Metric):
        return instance
    if isinstance(instance, StatefulMetric):
        return TorchMetric(instance)
    raise InputError(f"metric {text!r}: {cls.__name__} has no update(preds, target), compute() and reset()")


def evaluate(module: EvalModule, data: Iterable[Sequence[Any]], metrics: Sequence[Metric]) -> dict[str, float]:
    """Each metric over ``data`` (batches of the eval model's inputs: sequences in input order, or mappings
    by input name), the module in eval mode meanwhile."""
    was_training = module.training
    module.eval()
    for metric in metrics:
        metric.reset()
    try:
        names = module.input_names(False) if isinstance(module, NamedInputs) else None
        for batch in data:
            if isinstance(batch, Mapping) and names is None:
                raise InputError("evaluate: a batch keyed by input name needs a module with input_names()")
            values = model_inputs(batch, names) if isinstance(batch, Mapping) and names is not None else batch
            tensors = [_as_tensor(value, position) for position, value in enumerate(values)]
            outputs = module(*tensors)
            outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
            for metric in metrics:
                metric.update(outputs, tensors)
    finally:
        module.train(was_training)
    return {metric.name: metric.compute() for metric in metrics}


def _as_tensor(value: Any, position: int) -> torch.Tensor:
    """An eval input as a tensor: a numpy array shared when torch can (a read-only one, as pandas gives,
    copied)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return numpy_to_tensor(value, f"eval input #{position}")
    return torch.as_tensor(value)


def with_model_outputs(eval_model: ModelSource, parameter_names: Iterable[str]) -> onnx.ModelProto:
    """The eval model with the base model's outputs (the logits: recorded by ``generate_artifacts``, else
    the values the loss combines with the labels) appended after its own outputs, for metrics such as
    accuracy; the model itself when it outputs them already."""
    model = load_model(eval_model, "eval model")
    outputs = [value.name for value in model.graph.output]
    extra = [name for name in exportable_output_names(model, list(parameter_names)) if name not in outputs]
    if not extra:
        return model
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    extended.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in extra)
    return extended
