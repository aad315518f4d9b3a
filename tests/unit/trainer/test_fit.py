"""``trainer.fit`` on ORT-made artifacts (the cnn fixture): equal to the hand-written ORT loop (DataLoader
workers, gradient accumulation), resumable mid-epoch with the same data order, callbacks and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.errors import InputError
from ort_torch_train.trainer import (
    EarlyStopping,
    JsonlLogger,
    LogMetrics,
    ResumableBatchSampler,
    SaveBest,
    SaveCheckpoints,
    array_loader,
    fit,
    metric_named,
)
from tests.helpers.paths import FIXTURES

CNN = FIXTURES / "cnn"


def cnn_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The cnn case's 160 training samples, [samples, ...]."""
    with np.load(CNN / "data.npz") as data:
        return data["x_train"].reshape(-1, 1, 12, 12), data["y_train"].reshape(-1)


def cnn_module(checkpoint: Path | None = None) -> tuple[CheckpointState, Module, Optimizer]:
    artifacts = CNN / "artifacts"
    state = CheckpointState.load_checkpoint(checkpoint or artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    return state, module, Optimizer(artifacts / "optimizer_model.onnx", module)


def same_parameters(a: CheckpointState, b: CheckpointState) -> bool:
    left, right = a.training_state.state_dict(), b.training_state.state_dict()
    return left.keys() == right.keys() and all(torch.equal(left[name], right[name]) for name in left)


def steady_metric(outputs, batch) -> float:
    """A user metric that never improves after its first value."""
    return 1.0


def test_fit_on_a_dataloader_with_two_workers_equals_the_hand_written_loop() -> None:
    x, y = cnn_arrays()
    dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    state, module, optimizer = cnn_module()
    result = fit(module, optimizer, DataLoader(dataset, batch_size=8, num_workers=2), max_steps=6)
    assert (result.start_step, result.last_step, len(result.losses)) == (0, 6, 6)

    reference, ort_module, ort_optimizer = cnn_module()
    ort_module.train()
    losses = []
    for step, (inputs, labels) in enumerate(DataLoader(dataset, batch_size=8)):
        if step == 6:
            break
        losses.append(float(ort_module(inputs, labels)))
        ort_optimizer.step()
        ort_module.lazy_reset_grad()
    assert same_parameters(state, reference)
    assert result.losses == losses
    assert state.training_state.optimizer.step == reference.training_state.optimizer.step == 6


def test_gradient_accumulation_is_several_module_calls_per_optimizer_step() -> None:
    x, y = cnn_arrays()
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 48, 4)]  # 12 micro-batches, numpy
    state, module, optimizer = cnn_module()
    result = fit(module, optimizer, batches, epochs=1, grad_accum=4)
    assert result.last_step == 3

    reference, ort_module, ort_optimizer = cnn_module()
    ort_module.train()
    for step in range(3):
        for inputs, labels in batches[4 * step : 4 * step + 4]:
            ort_module(inputs, labels)
        ort_optimizer.step()
        ort_module.lazy_reset_grad()
    assert same_parameters(state, reference)


def test_resumed_mid_epoch_run_continues_the_same_data_order(tmp_path) -> None:
    x, y = cnn_arrays()
    whole, module, optimizer = cnn_module()
    fit(module, optimizer, array_loader([x, y], 32, seed=7), max_steps=7)  # 5 batches per epoch

    _, module, optimizer = cnn_module()
    fit(module, optimizer, array_loader([x, y], 32, seed=7), max_steps=3, callbacks=[SaveCheckpoints(tmp_path / "c")])
    resumed, module, optimizer = cnn_module(tmp_path / "c")
    assert (resumed.properties["ort_torch_train.data_epoch"], resumed.properties["ort_torch_train.data_position"]) == (
        0,
        3,
    )
    result = fit(module, optimizer, array_loader([x, y], 32, seed=7), max_steps=7)
    assert (result.start_step, result.last_step) == (3, 7)
    assert same_parameters(whole, resumed)
    again = fit(module, optimizer, array_loader([x, y], 32, seed=7), max_steps=7)  # the target is a total
    assert again.losses == [] and again.last_step == 7


def test_batch_sampler_orders_depend_on_seed_and_epoch_and_split_over_ranks() -> None:
    sampler = ResumableBatchSampler(20, 4, seed=3)
    first = list(sampler)
    assert sorted(i for batch in first for i in batch) == list(range(20)) and len(first) == 5
    sampler.set_position(0, 2)
    assert list(sampler) == first[2:]
    sampler.set_position(1, 0)
    assert list(sampler) != first
    ranks = [list(ResumableBatchSampler(20, 4, seed=3, rank=r, world_size=2)) for r in range(2)]
    assert [a + b for a, b in zip(*ranks)] == first
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        ResumableBatchSampler(20, 4, world_size=3)


def test_evaluation_best_checkpoint_early_stop_and_jsonl(tmp_path) -> None:
    x, y = cnn_arrays()
    state, module, optimizer = cnn_module()
    evaluation = [(x[:16], y[:16])]
    result = fit(
        module,
        optimizer,
        array_loader([x, y], 16),
        max_steps=20,
        eval_data=evaluation,
        eval_every=2,
        metrics=["loss", metric_named("tests.unit.trainer.test_fit:steady_metric")],
        callbacks=[
            LogMetrics([JsonlLogger(tmp_path / "m.jsonl")], every=2),
            SaveBest(tmp_path / "best", "loss"),
            EarlyStopping("steady_metric", patience=2),
        ],
    )
    assert result.last_step == 6 and result.stop_reason.startswith("early stop: steady_metric")
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 2, 4, 4, 6, 6]
    assert set(lines[1]) == {"step", "eval_loss", "eval_steady_metric"}
    best = CheckpointState.load_checkpoint(tmp_path / "best")
    assert best.properties["ort_torch_train.save_best.best_loss"] == pytest.approx(
        min(line["eval_loss"] for line in lines if "eval_loss" in line)
    )
    assert state.properties["ort_torch_train.early_stop.waited"] == 2


def test_accuracy_needs_the_logits_and_bad_arguments_are_named() -> None:
    x, y = cnn_arrays()
    _, module, optimizer = cnn_module()
    with pytest.raises(InputError, match="max_steps"):
        fit(module, optimizer, [(x, y)])
    with pytest.raises(InputError, match="eval_every: needs eval_data"):
        fit(module, optimizer, [(x, y)], max_steps=1, eval_every=1)
    with pytest.raises(InputError, match="no function 'nope'"):
        metric_named("tests.unit.trainer.test_fit:nope")
    with pytest.raises(Exception, match="accuracy needs the model's logits"):
        fit(module, optimizer, [(x[:8], y[:8])], max_steps=1, eval_data=[(x[:8], y[:8])], metrics=["accuracy"])
    with pytest.raises(InputError, match="data: yields no batches"):
        fit(module, optimizer, [], max_steps=100)
