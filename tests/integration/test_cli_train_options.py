"""``train``'s run options: --json summary, --metrics JSONL, --save-every, --quiet, Ctrl-C (SIGINT) saving a
checkpoint that --resume continues exactly, -v logging, and --tensorboard."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ort_torch_train.checkpoint.state import TrainingState
from tests.unit.cli.test_cli import ort_case, run_cli, sample_major_npz


@pytest.fixture
def cnn_data(tmp_path) -> tuple[Path, Path]:
    case = ort_case("cnn")
    return case / "artifacts", sample_major_npz(case, tmp_path / "train.npz")


def test_json_summary_metrics_lines_and_periodic_saves(capsys, tmp_path, cnn_data) -> None:
    artifacts, data = cnn_data
    metrics = tmp_path / "logs" / "metrics.jsonl"
    code, out, err = run_cli(
        capsys,
        "train",
        artifacts,
        "--data",
        data,
        "--batch-size",
        8,
        "--steps",
        7,
        "--metrics",
        metrics,
        "--metrics-every",
        3,
        "--save-every",
        3,
        "--eval-data",
        data,
        "--output",
        tmp_path / "ckpt",
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)  # stdout is the JSON summary only
    assert summary["first_step"] == 1 and summary["last_step"] == 7
    assert summary["steps_per_s"] > 0 and summary["compile_seconds"] is None
    assert summary["eval_loss"] < summary["eval_loss_before"]
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["step"] for line in lines] == [3, 6, 7, 7]  # every 3 steps, the last step, then the eval
    assert lines[-2]["loss"] == pytest.approx(summary["loss_last"])
    assert all(line["lr"] == pytest.approx(1e-3) and line["steps_per_s"] > 0 for line in lines[:-1])
    assert lines[-1]["eval_loss"] == pytest.approx(summary["eval_loss"])
    assert TrainingState.load(tmp_path / "ckpt").optimizer.step == 7


def test_save_every_reports_each_save_and_quiet_prints_nothing(capsys, tmp_path, cnn_data) -> None:
    artifacts, data = cnn_data
    common = ["train", artifacts, "--data", data, "--batch-size", 8, "--steps", 4]
    code, out, err = run_cli(capsys, *common, "--save-every", 2, "--output", tmp_path / "a")
    assert code == 0, err
    assert "step 2: checkpoint saved" in out and "step 4: checkpoint saved" in out
    assert "4/4" in err and "step/s" in err  # tqdm's bar
    code, out, err = run_cli(capsys, *common, "--quiet", "--output", tmp_path / "b")
    assert code == 0 and out == "" and err == ""
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_that_resumes_exactly(capsys, tmp_path, cnn_data) -> None:
    artifacts, data = cnn_data
    metrics = tmp_path / "metrics.jsonl"
    common = ["train", str(artifacts), "--data", str(data), "--batch-size", "8"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ort_torch_train",
            "-v",
            *common,
            "--steps",
            "100000",
            "--metrics",
            str(metrics),
            "--output",
            str(tmp_path / "interrupted"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "training never wrote 3 metrics lines"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err[-2000:]
    assert "interrupted" in err and "saved checkpoint" in err  # -v logs checkpoint I/O
    done = TrainingState.load(tmp_path / "interrupted").optimizer.step
    assert 3 <= done < 100000
    assert json.loads(metrics.read_text().splitlines()[-1])["step"] == done
    assert f"step {done}: checkpoint saved" in out

    code, out, err = run_cli(
        capsys, *common, "--steps", 2, "--resume", tmp_path / "interrupted", "--output", tmp_path / "resumed"
    )
    assert code == 0, err
    assert f"at step {done}" in out
    assert run_cli(capsys, *common, "--steps", done + 2, "--output", tmp_path / "whole")[0] == 0
    assert (tmp_path / "resumed").read_bytes() == (tmp_path / "whole").read_bytes()


@pytest.mark.slow
def test_log_level_from_the_environment() -> None:
    if "ORT_TORCH_TRAIN_LOG" not in os.environ:  # silent by default: only a NullHandler
        assert all(isinstance(h, logging.NullHandler) for h in logging.getLogger("ort_torch_train").handlers)
    checkpoint = ort_case("cnn") / "artifacts" / "checkpoint"
    code = f"from ort_torch_train.checkpoint.state import TrainingState; TrainingState.load({str(checkpoint)!r})"
    loud = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ORT_TORCH_TRAIN_LOG": "debug"},
    )
    assert loud.returncode == 0 and loud.stdout == "", loud.stderr
    assert "ort_torch_train.checkpoint.state INFO: loaded checkpoint" in loud.stderr


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_tensorboard_without_the_package_is_a_clear_error(capsys, tmp_path, cnn_data) -> None:
    artifacts, data = cnn_data
    code, _, err = run_cli(
        capsys,
        "train",
        artifacts,
        "--data",
        data,
        "--steps",
        1,
        "--batch-size",
        8,
        "--tensorboard",
        tmp_path / "tb",
        "--output",
        tmp_path / "ckpt",
    )
    assert code == 1
    assert "--tensorboard needs the tensorboard package" in err and "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_scalars(capsys, tmp_path, cnn_data) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    artifacts, data = cnn_data
    code, _, err = run_cli(
        capsys,
        "train",
        artifacts,
        "--data",
        data,
        "--steps",
        3,
        "--batch-size",
        8,
        "--tensorboard",
        tmp_path / "tb",
        "--output",
        tmp_path / "ckpt",
        "--quiet",
    )
    assert code == 0, err
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2, 3]


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_clock_restarts_after_a_compiling_step(quiet) -> None:
    import io

    from ort_torch_train.progress import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(3, "training", stream=stream, disable=quiet)
    time.sleep(1.2)  # the first step compiles
    bar.reset_clock()  # what fit does after the first step, before showing it
    bar.update(loss=1.0)
    bar.update(loss=0.5)
    bar.close()
    assert (stream.getvalue() == "") == quiet
    if not quiet:
        last = stream.getvalue().splitlines()[-1]
        assert "2/3 [00:00<" in last and "loss=0.5" in last  # the elapsed time leaves the compilation out
