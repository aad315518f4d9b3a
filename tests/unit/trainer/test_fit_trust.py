"""``fit``'s callbacks and resumption trust only what the run wrote: keep-last pruning deletes this run's
numbered checkpoints (with their external data and manifest) and nothing else, early stopping survives a
metric that is never finite and stays stopped on resume, and edited data positions are refused."""

from __future__ import annotations

import math
import os
import signal

import pytest

from ort_torch_train.errors import CheckpointError, InputError
from ort_torch_train.trainer import EarlyStopping, SaveBest, SaveCheckpoints, array_loader, fit, metric_named
from ort_torch_train.trainer.fit_state import Callback, FitState
from tests.unit.trainer.test_fit import cnn_arrays, cnn_module, same_parameters

COMPANIONS = ("", ".data", ".manifest")


def nan_metric(outputs, batch) -> float:
    """A user metric that is never finite (as with one NaN in the eval data)."""
    return math.nan


def steady_metric(outputs, batch) -> float:
    """A user metric that never improves after its first value."""
    return 1.0


def test_keep_last_deletes_only_the_files_this_run_wrote(tmp_path) -> None:
    x, y = cnn_arrays()
    foreign = {"c.step-500": b"run A", "c.step-900": b"run A", "c.step-0042": b"mine", "c.step-7.data": b"x"}
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "c.step-0").mkdir()
    state, module, optimizer = cnn_module()
    state.training_state.has_external_data = True  # each save writes c, c.data and c.manifest
    saves = SaveCheckpoints(tmp_path / "c", every=1, keep_last=2)
    fit(module, optimizer, array_loader([x, y], 16), max_steps=4, callbacks=[saves])
    numbered = {f"c.step-{step}{suffix}" for step in (3, 4) for suffix in COMPANIONS}
    assert {p.name for p in tmp_path.iterdir()} == {"c", "c.data", "c.manifest", "c.step-0", *foreign, *numbered}
    assert all((tmp_path / name).read_bytes() == data for name, data in foreign.items())

    _, module, optimizer = cnn_module(tmp_path / "c")  # resumed: the record travels in the checkpoint
    saves = SaveCheckpoints(tmp_path / "c", every=1, keep_last=2)
    fit(module, optimizer, array_loader([x, y], 16), max_steps=6, callbacks=[saves])
    numbered = {f"c.step-{step}{suffix}" for step in (5, 6) for suffix in COMPANIONS}
    assert {p.name for p in tmp_path.iterdir()} == {"c", "c.data", "c.manifest", "c.step-0", *foreign, *numbered}


def test_keep_last_refuses_to_overwrite_a_foreign_numbered_checkpoint_before_training(tmp_path) -> None:
    x, y = cnn_arrays()
    (tmp_path / "c.step-4").write_bytes(b"another run's")
    state, module, optimizer = cnn_module()
    saves = SaveCheckpoints(tmp_path / "c", every=2, keep_last=1)
    with pytest.raises(InputError, match=r"c\.step-4.*not written by this run"):
        fit(module, optimizer, array_loader([x, y], 16), max_steps=6, callbacks=[saves])
    assert state.training_state.optimizer.step == 0 and (tmp_path / "c.step-4").read_bytes() == b"another run's"


def test_a_never_finite_metric_stops_early_with_a_warning_and_saves(tmp_path, caplog) -> None:
    x, y = cnn_arrays()
    _, module, optimizer = cnn_module()
    callbacks = [SaveCheckpoints(tmp_path / "c"), EarlyStopping("nan_metric", patience=2)]
    metric = metric_named("tests.unit.trainer.test_fit_trust:nan_metric")
    evaluation = [(x[:8], y[:8])]
    run = dict(max_steps=10, eval_data=evaluation, eval_every=1, metrics=["loss", metric], callbacks=callbacks)
    with caplog.at_level("WARNING"):
        result = fit(module, optimizer, array_loader([x, y], 16), **run)
    assert result.last_step == 2 and "no finite value" in result.stop_reason
    assert "nan_metric is nan" in caplog.text
    saved = (tmp_path / "c").read_bytes()
    state, module, optimizer = cnn_module(tmp_path / "c")
    assert state.training_state.optimizer.step == 2

    callbacks = [SaveCheckpoints(tmp_path / "c"), EarlyStopping("nan_metric", patience=2)]
    again = fit(module, optimizer, array_loader([x, y], 16), **{**run, "callbacks": callbacks})
    assert again.losses == [] and "stopped early at step 2" in again.stop_reason
    assert (tmp_path / "c").read_bytes() == saved  # nothing trained, nothing counted


class Interrupt(Callback):
    """Sends this process a SIGINT (a Ctrl-C) after step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, run: FitState) -> None:
        if run.step == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def test_the_evaluation_after_ctrl_c_does_not_count_toward_patience(tmp_path) -> None:
    x, y = cnn_arrays()
    metric = metric_named("tests.unit.trainer.test_fit_trust:steady_metric")
    run = dict(max_steps=8, eval_data=[(x[:8], y[:8])], eval_every=2, metrics=[metric])
    whole, module, optimizer = cnn_module()
    fit(module, optimizer, array_loader([x, y], 16), **run, callbacks=[EarlyStopping("steady_metric", 10)])

    _, module, optimizer = cnn_module()
    callbacks = [SaveCheckpoints(tmp_path / "c"), EarlyStopping("steady_metric", 10), Interrupt(3)]
    assert fit(module, optimizer, array_loader([x, y], 16), **run, callbacks=callbacks).interrupted
    resumed, module, optimizer = cnn_module(tmp_path / "c")
    fit(module, optimizer, array_loader([x, y], 16), **run, callbacks=[EarlyStopping("steady_metric", 10)])
    waited = "ort_torch_train.early_stop.waited"
    assert resumed.properties[waited] == whole.properties[waited] == 3


RUNS: list[FitState] = []  # the run in progress (set by StepTracker), read by best_at_step_3


class StepTracker(Callback):
    """Lets ``best_at_step_3`` see the step of the run in progress."""

    def on_train_begin(self, run: FitState) -> None:
        RUNS[:] = [run]


def best_at_step_3(outputs, batch) -> float:
    """A user metric (lower is better) that improves at every step and is best of all right after step 3."""
    step = RUNS[0].step
    return 0.0 if step == 3 else 10.0 - step


def test_save_best_ignores_the_evaluation_after_ctrl_c(tmp_path) -> None:
    """Ctrl-C after step 3 (between the evaluations at 2 and 4): the resumed run saves the best checkpoint
    at the step the uninterrupted run does, not at 3."""
    x, y = cnn_arrays()
    metric = metric_named("tests.unit.trainer.test_fit_trust:best_at_step_3")
    run = dict(max_steps=8, eval_data=[(x[:8], y[:8])], eval_every=2, metrics=[metric])
    best_step = "ort_torch_train.save_best.step"
    _, module, optimizer = cnn_module()
    callbacks = [StepTracker(), SaveBest(tmp_path / "whole.best", "best_at_step_3")]
    fit(module, optimizer, array_loader([x, y], 16), **run, callbacks=callbacks)
    whole, _, _ = cnn_module(tmp_path / "whole.best")

    _, module, optimizer = cnn_module()
    callbacks = [StepTracker(), SaveCheckpoints(tmp_path / "c"), SaveBest(tmp_path / "c.best", "best_at_step_3")]
    assert fit(module, optimizer, array_loader([x, y], 16), **run, callbacks=[*callbacks, Interrupt(3)]).interrupted
    assert cnn_module(tmp_path / "c.best")[0].properties[best_step] == 2  # step 3's evaluation was not acted on
    _, module, optimizer = cnn_module(tmp_path / "c")
    fit(module, optimizer, array_loader([x, y], 16), **run, callbacks=callbacks)
    resumed, _, _ = cnn_module(tmp_path / "c.best")
    assert resumed.properties[best_step] == whole.properties[best_step] == 8
    best = "ort_torch_train.save_best.best_best_at_step_3"
    assert resumed.properties[best] == whole.properties[best] == 2.0
    assert same_parameters(resumed, whole)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("data_position", -8, r"data_position.*-8.*\[0, 10\]"),
        ("data_position", 11, r"data_position.*11.*\[0, 10\]"),
        ("data_position", math.nan, "data_position.*nan"),
        ("data_epoch", -1, r"data_epoch.*-1.*>= 0"),
        ("data_epoch", math.inf, "data_epoch.*inf"),
        ("data_seed", "abc", "data_seed.*'abc'.*integer"),
    ],
)
def test_edited_data_position_properties_are_refused_before_a_step(name, value, expected) -> None:
    x, y = cnn_arrays()
    state, module, optimizer = cnn_module()
    properties = state.properties
    properties["ort_torch_train.data_epoch"], properties["ort_torch_train.data_position"] = 0, 2
    properties["ort_torch_train.data_seed"] = 0
    properties[f"ort_torch_train.{name}"] = value
    with pytest.raises(CheckpointError, match=expected):
        fit(module, optimizer, array_loader([x, y], 16), max_steps=4)
    assert state.training_state.optimizer.step == 0
