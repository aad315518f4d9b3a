"""The end of a `train` run says why it ended (the length reached, an early stop with its metric, patience and
step, also at the last step, Ctrl-C); a run resumed from an early stop keeps it for the same command and trains
on when asked for more; the bar's rate and the steps' rate are both labelled; metrics files hold float32 values
as their shortest decimals."""

from __future__ import annotations

import json
import os
import re
import signal

import numpy as np
import pytest

from ort_torch_train.trainer.loggers import as_written
from tests.unit.cli.test_cli import run_cli
from tests.unit.cli.test_cli_trust import cnn_data  # noqa: F401 (a fixture)

STEADY = "tests.unit.trainer.test_fit:steady_metric"  # 1.0 at every evaluation: improves once, then never
INTERRUPT = {"armed": False}


def interrupting_metric(outputs, batch) -> float:
    """An eval metric that sends this process a SIGINT (a Ctrl-C) once when armed."""
    if INTERRUPT["armed"]:
        INTERRUPT["armed"] = False
        os.kill(os.getpid(), signal.SIGINT)
    return 0.0


def train(capsys, cnn_data, *options: object) -> tuple[int, str, str]:  # noqa: F811
    artifacts, data = cnn_data
    return run_cli(capsys, "train", artifacts, "--data", data, "--batch-size", 8, *options)


def test_an_early_stop_at_the_last_step_is_reported_and_a_larger_max_steps_trains_on(capsys, tmp_path, cnn_data):  # noqa: F811
    _, data = cnn_data
    ckpt = tmp_path / "c"
    early = ["--eval-data", data, "--eval-every", 2, "--metric", STEADY, "--early-stop", 2, "--output", ckpt]
    code, out, err = train(capsys, cnn_data, "--max-steps", 6, *early)  # evaluations at 2 (best), 4, 6: stop at 6
    assert code == 0, err
    assert (
        "ended at step 6: --max-steps 6 reached; early stop: steady_metric did not improve in 2 evaluations at "
        "step 6 (patience 2; best 1)"
    ) in out
    saved = ckpt.read_bytes()

    code, out, err = train(capsys, cnn_data, "--max-steps", 6, *early, "--resume", ckpt)  # the same command
    assert code == 0, err
    assert "already at step 6: nothing to train (--max-steps 6)" in out
    assert ckpt.read_bytes() == saved

    code, out, err = train(capsys, cnn_data, "--max-steps", 12, *early, "--resume", ckpt, "--json")
    assert code == 0, err
    summary = json.loads(out)  # evaluations at 8 and 10 without improvement: a new stop at 10
    assert (summary["first_step"], summary["last_step"], summary["ended"]) == (7, 10, "early_stop")
    assert summary["end"].startswith("early stop: steady_metric did not improve in 2 evaluations at step 10")
    code, out, err = train(capsys, cnn_data, "--max-steps", 12, *early, "--resume", ckpt)  # the same again
    assert code == 0, err
    assert "already at step 10: nothing to train; early stop: the run stopped early at step 10" in out
    assert "give a max_steps above 12 (--max-steps), a patience above 2" in out
    code, out, err = train(capsys, cnn_data, "--max-steps", 14, *early, "--resume", ckpt)
    assert code == 0, err
    assert "the checkpoint's run stopped early at step 10 (steady_metric did not improve in 2 evaluations" in out
    assert "training on to step 14" in out and "trained steps 11-14" in out

    code, out, err = train(capsys, cnn_data, "--steps", 2, *early, "--resume", ckpt, "--json")
    assert code == 0, err  # the stop at 14 (evaluations at 12 and 14), then --steps: counted from it
    summary = json.loads(out)
    assert (summary["first_step"], summary["last_step"], summary["ended"]) == (15, 16, "length")
    assert summary["end"].startswith("ended at step 16: --steps 2 reached")


def test_ctrl_c_ends_the_run_and_says_so(capsys, tmp_path, cnn_data) -> None:  # noqa: F811
    _, data = cnn_data
    metric = "tests.unit.cli.test_cli_run_end:interrupting_metric"
    INTERRUPT["armed"] = False
    options = [
        "--max-steps",
        50,
        "--eval-data",
        data,
        "--eval-every",
        3,
        "--metric",
        metric,
        "--output",
        tmp_path / "c",
    ]
    INTERRUPT["armed"] = True
    code, out, err = train(capsys, cnn_data, *options)
    assert code == 130, err
    assert f"ended by Ctrl-C after step 3: checkpoint saved, `--resume {tmp_path / 'c'}` continues the run" in out


def test_metrics_files_and_the_summary_hold_float32_values_as_set_and_both_rates_are_labelled(
    capsys,
    tmp_path,
    cnn_data,  # noqa: F811
) -> None:
    _, data = cnn_data
    metrics = tmp_path / "m.jsonl"
    options = ["--max-steps", 12, "--lr", "0.01", "--metrics", metrics, "--output", tmp_path / "c"]
    code, out, err = train(capsys, cnn_data, *options, "--eval-data", data, "--eval-every", 1)
    assert code == 0, err
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [line for line in lines if "lr" in line]
    assert len(steps) == 12 and all(line["lr"] == 0.01 for line in steps)
    assert '"lr": 0.01,' in metrics.read_text()
    for line in steps:  # the loss as its shortest float32 decimal
        assert repr(line["loss"]) == str(np.float32(line["loss"]))
    value, unit = re.findall(r"([0-9.]+)(step/s|s/step)", err)[-1]  # the bar's last rate (tqdm inverts a slow one)
    bar = float(value) if unit == "step/s" else 1 / float(value)
    shown = re.search(r"on cpu: ([0-9.]+) step/s \(the bar's rate, evaluation and saving included; ([0-9.]+) step/s "
                      r"in the training steps alone\)", out)  # fmt: skip
    assert shown, out
    assert float(shown.group(1)) == pytest.approx(bar, rel=0.05)
    assert float(shown.group(1)) < float(shown.group(2))  # an evaluation after every step: the bar's rate is lower
    code, out, err = train(capsys, cnn_data, *options, "--resume", tmp_path / "c", "--max-steps", 13, "--json")
    summary = json.loads(out)
    assert repr(summary["loss_first"]) == str(np.float32(summary["loss_first"]))
    assert summary["steps_per_s"] is None and summary["steps_per_s_overall"] is None  # one step: no rate


def test_as_written_shortens_float32_values_only() -> None:
    assert as_written(float(np.float32(0.01))) == 0.01
    assert as_written(float(np.float32(2.4146073))) == 2.4146073
    assert as_written(0.1) == 0.1  # a float64 that is no float32 stays as it is
    assert as_written(1 / 3) == 1 / 3
    assert as_written(1e300) == 1e300 and as_written(float("inf")) == float("inf")
    assert np.isnan(as_written(float("nan")))
    assert as_written(3) == 3
