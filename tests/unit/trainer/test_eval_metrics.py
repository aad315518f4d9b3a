"""``evaluate`` on dict batches, the regression metrics against scikit-learn's, and metrics that do not
fit the model's outputs refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ort_torch_train.errors import ModelError
from ort_torch_train.trainer import evaluate, metric_named
from tests.unit.trainer.test_fit import cnn_arrays, cnn_module


def test_evaluate_takes_batches_keyed_by_input_name() -> None:
    _, module, _ = cnn_module()
    x, y = cnn_arrays()
    batches = [(x[:32], y[:32]), (x[32:48], y[32:48])]
    by_position = evaluate(module, batches, [metric_named("loss")])
    by_name = evaluate(module, [{"labels": b, "input": a} for a, b in batches], [metric_named("loss")])
    assert by_name == by_position and math.isfinite(by_name["loss"])


def test_regression_metrics_match_scikit_learn() -> None:
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    target = rng.standard_normal((50, 1)).astype(np.float32)
    predicted = target + 0.3 * rng.standard_normal((50, 1)).astype(np.float32)
    values = {}
    for name in ("mae", "rmse", "r2"):
        metric = metric_named(name)
        metric.reset()
        for begin in (0, 16, 32):  # batches of unequal size
            rows = slice(begin, begin + 16 if begin < 32 else 50)
            outputs = (torch.tensor(0.0), torch.from_numpy(predicted[rows]))
            features = torch.zeros(len(target[rows]), 4)  # the first input: its rows weigh the batch
            metric.update(outputs, [features, torch.from_numpy(target[rows]).reshape(-1)])
        values[name] = metric.compute()
    assert values["mae"] == pytest.approx(sklearn_metrics.mean_absolute_error(target, predicted), rel=1e-6)
    assert values["rmse"] == pytest.approx(math.sqrt(sklearn_metrics.mean_squared_error(target, predicted)), rel=1e-6)
    assert values["r2"] == pytest.approx(sklearn_metrics.r2_score(target, predicted), rel=1e-6)
    assert metric_named("r2").higher_is_better and not metric_named("rmse").higher_is_better


def test_metric_that_does_not_fit_the_outputs_is_an_error() -> None:
    regression_target = torch.tensor([0.5, 1.7, -2.0])
    with pytest.raises(ModelError, match="regression target; use --metric mae, rmse or r2"):
        metric_named("accuracy").update((torch.tensor(0.0), torch.zeros(3, 1)), [regression_target])
    logits, labels = torch.zeros(3, 10), torch.tensor([1, 2, 3])
    with pytest.raises(ModelError, match=r"output is \[3, 10\] and the target \[3\].*--metric accuracy"):
        metric_named("rmse").update((torch.tensor(0.0), logits), [labels])
    binary = torch.tensor([0.0, 1.0, 1.0])  # a BCE model's float labels stay fine for accuracy
    accuracy = metric_named("accuracy")
    accuracy.update((torch.tensor(0.0), torch.tensor([[-1.0], [2.0], [3.0]])), [binary])
    assert accuracy.compute() == 1.0


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_grad_accum_mean_averages_the_micro_batches(reduction) -> None:
    """One step over the same batch twice: averaged, the gradient is the single batch's (bit for bit)."""
    from ort_torch_train.trainer import fit

    x, y = cnn_arrays()
    _, single, optimizer = cnn_module()
    fit(single, optimizer, [(x[:16], y[:16])], max_steps=1)
    _, accumulated, optimizer = cnn_module()
    fit(accumulated, optimizer, [(x[:16], y[:16])] * 2, max_steps=1, grad_accum=2, grad_accum_reduction=reduction)
    one = single.training_state.params
    two = accumulated.training_state.params
    same = all(torch.equal(one[name].grad, two[name].grad) for name in one if one[name].grad is not None)
    assert same == (reduction == "mean")
    if reduction == "sum":
        name = next(name for name in one if one[name].grad is not None)
        torch.testing.assert_close(two[name].grad, 2 * one[name].grad)


def test_stop_reason_names_only_a_stop_that_shortened_the_run() -> None:
    from ort_torch_train.trainer import Callback, fit

    class StopOnEvaluate(Callback):
        def on_evaluate(self, run, metrics) -> None:
            run.stop("early stop: asked")

    x, y = cnn_arrays()
    data, eval_data = [(x[:16], y[:16])], [(x[16:32], y[16:32])]
    _, module, optimizer = cnn_module()
    ran_out = fit(module, optimizer, data, max_steps=2, eval_data=eval_data, callbacks=[StopOnEvaluate()])
    assert (ran_out.last_step, ran_out.stop_reason) == (2, None)  # the closing evaluation stops nothing
    _, module, optimizer = cnn_module()
    stopped = fit(module, optimizer, data, max_steps=3, eval_data=eval_data, eval_every=1, callbacks=[StopOnEvaluate()])
    assert (stopped.last_step, stopped.stop_reason) == (1, "early stop: asked")


def test_shape_errors_name_the_expected_shape_and_the_fix() -> None:
    from ort_torch_train.errors import InputError
    from ort_torch_train.trainer import fit

    x, y = cnn_arrays()
    _, module, optimizer = cnn_module()
    with pytest.raises(
        InputError, match=r"is \[batch, 1, 12, 12\], the batch holds \[8, 144\]: .*reshape\(8, 1, 12, 12\)"
    ):
        fit(module, optimizer, [(x[:8].reshape(8, 144), y[:8])], max_steps=1)
