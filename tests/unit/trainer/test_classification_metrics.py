"""f1, precision, recall and auroc against scikit-learn's (binary with one logit or two, and macro over
classes), over eval batches of unequal size; a torchmetrics metric accepted where a metric is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.errors import InputError, ModelError
from ort_torch_train.trainer import TorchMetric, evaluate, fit, metric_named, with_model_outputs
from tests.helpers.paths import FIXTURES
from tests.unit.trainer.test_fit import cnn_arrays, cnn_module

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def batched(metric, logits: np.ndarray, labels: np.ndarray) -> float:
    """The metric over three eval batches of unequal size."""
    metric.reset()
    for rows in (slice(0, 7), slice(7, 40), slice(40, None)):
        metric.update((torch.tensor(0.0), torch.from_numpy(logits[rows])), [torch.from_numpy(labels[rows])])
    return metric.compute()


def softmax(logits: np.ndarray) -> np.ndarray:
    return torch.softmax(torch.from_numpy(logits), -1).numpy()


def test_multiclass_metrics_match_scikit_learn() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 90)
    logits = (rng.standard_normal((90, 4)) + 1.5 * np.eye(4)[labels]).astype(np.float32)
    predicted = logits.argmax(1)
    for name, expected in [
        ("f1", sklearn_metrics.f1_score(labels, predicted, average="macro")),
        ("precision", sklearn_metrics.precision_score(labels, predicted, average="macro")),
        ("recall", sklearn_metrics.recall_score(labels, predicted, average="macro")),
        ("auroc", sklearn_metrics.roc_auc_score(labels, softmax(logits), multi_class="ovr")),
    ]:
        assert batched(metric_named(name), logits, labels) == pytest.approx(expected, rel=1e-9, abs=1e-12), name
        assert metric_named(name).higher_is_better


@pytest.mark.parametrize("form", ["one logit", "two logits"])
def test_binary_metrics_match_scikit_learn(form: str) -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 80)
    score = (rng.standard_normal(80) + labels).astype(np.float32)
    score[:10] = score[10:20]  # tied scores
    logits = score[:, None] if form == "one logit" else np.stack([np.zeros_like(score), score], 1)
    predicted = (score > 0).astype(np.int64)
    for name, expected in [
        ("f1", sklearn_metrics.f1_score(labels, predicted)),
        ("precision", sklearn_metrics.precision_score(labels, predicted)),
        ("recall", sklearn_metrics.recall_score(labels, predicted)),
        ("auroc", sklearn_metrics.roc_auc_score(labels, score)),
    ]:
        value = batched(metric_named(name), logits, labels.astype(np.float32 if form == "one logit" else np.int64))
        assert value == pytest.approx(expected, rel=1e-9, abs=1e-12), name


def test_undefined_ratios_count_as_zero_and_a_single_class_auroc_is_nan() -> None:
    labels = np.zeros(50, dtype=np.int64)
    logits = np.full((50, 1), -1.0, dtype=np.float32)  # nothing predicted positive, no positive label
    with pytest.warns(Warning):  # scikit-learn warns and gives 0
        expected = sklearn_metrics.f1_score(labels, np.zeros(50, dtype=np.int64), zero_division="warn")
    assert batched(metric_named("f1"), logits, labels) == expected == 0.0
    assert math.isnan(batched(metric_named("auroc"), logits, labels))


def test_classification_metrics_refuse_what_does_not_fit() -> None:
    with pytest.raises(ModelError, match="hold fractions: a regression target"):
        metric_named("f1").update((torch.tensor(0.0), torch.zeros(3, 1)), [torch.tensor([0.5, 1.0, 0.0])])
    with pytest.raises(ModelError, match=r"expected class labels from 0 to 3 .* got labels from 0 to 7"):
        metric_named("recall").update((torch.tensor(0.0), torch.zeros(3, 4)), [torch.tensor([0, 7, 1])])
    with pytest.raises(ModelError, match="outputs only its loss"):
        metric_named("auroc").update((torch.tensor(0.0),), [torch.tensor([0, 1])])
    with pytest.raises(InputError, match="MulticlassF1Score\\(\\) needs arguments"):
        pytest.importorskip("torchmetrics")
        metric_named("torchmetrics.classification:MulticlassF1Score")
    with pytest.raises(InputError, match="got int"):
        fit(*cnn_module()[1:], [], max_steps=1, metrics=[3])


def cnn_with_logits() -> tuple[Module, Optimizer]:
    """The cnn fixture's module whose eval model also outputs the logits (as the CLI builds it)."""
    state, plain, _ = cnn_module()
    artifacts = FIXTURES / "cnn" / "artifacts"
    eval_model = with_model_outputs(artifacts / "eval_model.onnx", plain.training_state.params)
    module = Module(
        artifacts / "training_model.onnx", CheckpointState.load_checkpoint(artifacts / "checkpoint"), eval_model
    )
    return module, Optimizer(artifacts / "optimizer_model.onnx", module)


def test_torchmetrics_metric_is_accepted_where_a_metric_is_named() -> None:
    torchmetrics = pytest.importorskip("torchmetrics")
    x, y = cnn_arrays()
    module, optimizer = cnn_with_logits()
    eval_batches = [(x[:32], y[:32]), (x[32:48], y[32:48])]
    theirs = TorchMetric(torchmetrics.classification.MulticlassF1Score(num_classes=10, average="macro"), name="tm_f1")
    values = evaluate(module, eval_batches, [metric_named("f1"), theirs])
    assert values["tm_f1"] == pytest.approx(values["f1"], rel=1e-6)
    by_name = metric_named("torchmetrics.classification:BinaryAUROC")
    assert by_name.name == "BinaryAUROC" and by_name.higher_is_better
    accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=10, average="micro")
    result = fit(
        module, optimizer, [(x[:16], y[:16])], max_steps=2, eval_data=eval_batches, metrics=["accuracy", accuracy]
    )
    assert set(result.metrics) == {"accuracy", "MulticlassAccuracy"}
    assert result.metrics["MulticlassAccuracy"] == pytest.approx(result.metrics["accuracy"], rel=1e-6)
