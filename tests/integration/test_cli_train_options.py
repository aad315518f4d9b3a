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

import numpy as np
import pytest
import torch

from ort_torch_train.state.training_state import TrainingState
from tests.helpers.timeouts import scaled
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
        deadline = time.monotonic() + scaled(240)
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "training never wrote 3 metrics lines"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=scaled(120))
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
    code = f"from ort_torch_train.state.training_state import TrainingState; TrainingState.load({str(checkpoint)!r})"
    loud = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        env={**os.environ, "ORT_TORCH_TRAIN_LOG": "debug"},
    )
    assert loud.returncode == 0 and loud.stdout == "", loud.stderr
    assert "ort_torch_train.state.training_state INFO: loaded checkpoint" in loud.stderr


def _train_with_tensorboard(capsys, tmp_path, cnn_data, steps: int, *options: str) -> tuple[int, str, str]:
    """``train`` on the cnn data for ``steps`` steps of 8 rows, logging to ``tmp_path/tb``: the CLI's code, out, err."""
    artifacts, data = cnn_data
    command = ["train", artifacts, "--data", data, "--steps", steps, "--batch-size", 8]
    return run_cli(capsys, *command, "--tensorboard", tmp_path / "tb", "--output", tmp_path / "ckpt", *options)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_tensorboard_without_the_package_is_a_clear_error(capsys, tmp_path, cnn_data) -> None:
    code, _, err = _train_with_tensorboard(capsys, tmp_path, cnn_data, 1)
    assert code == 1
    assert (
        "needs the tensorboard package: python -m ort_torch_train.install --extra tensorboard" in err
        and "Traceback" not in err
    )


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_scalars(capsys, tmp_path, cnn_data) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code, _, err = _train_with_tensorboard(capsys, tmp_path, cnn_data, 3, "--quiet")
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


# ---- data files, accumulation, evaluation and checkpoint options ------------------------------------
INTERRUPT = {"armed": False}


def interrupting_metric(outputs, batch) -> float:
    """An eval metric (``--metric tests.integration.test_cli_train_options:interrupting_metric``) that
    sends this process a SIGINT once when armed: a Ctrl-C at a known step, mid-epoch."""
    if INTERRUPT["armed"]:
        INTERRUPT["armed"] = False
        os.kill(os.getpid(), signal.SIGINT)
    return 0.0


@pytest.fixture
def tables(tmp_path, cnn_data) -> dict[str, Path]:
    """The cnn case's samples as Parquet (a list column) and CSV (one column per pixel) files."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pa_parquet

    artifacts, data = cnn_data
    with np.load(data) as arrays:
        x, labels = arrays["input"].reshape(-1, 144), arrays["labels"]
    pa_parquet.write_table(pa.table({"label": labels, "image": list(x)}), tmp_path / "train.parquet")
    pa_parquet.write_table(pa.table({"label": labels[:32], "image": list(x[:32])}), tmp_path / "eval.parquet")
    columns = {f"px{i}": x[:, i] for i in range(144)}
    pa_csv.write_csv(pa.table({**columns, "label": labels}), tmp_path / "train.csv")
    pa_csv.write_csv(pa.table({**{k: v[:32] for k, v in columns.items()}, "label": labels[:32]}), tmp_path / "eval.csv")
    return {"artifacts": artifacts, "npz": data, "x": x, "labels": labels, **{p.name: p for p in tmp_path.iterdir()}}


@pytest.mark.slow
def test_parquet_and_csv_with_accumulation_evaluation_and_checkpoints(capsys, tmp_path, tables) -> None:
    from ort_torch_train.api import CheckpointState, ConstantWithWarmupLRScheduler, Module, Optimizer

    outputs = {}
    for kind, inputs in (("parquet", "input=image,labels=label"), ("csv", "input=px*,labels=label")):
        code, out, err = run_cli(
            capsys,
            "train",
            tables["artifacts"],
            "--data",
            tables[f"train.{kind}"],
            "--inputs",
            inputs,
            "--batch-size",
            8,
            "--grad-accum",
            4,
            "--max-steps",
            4,
            "--no-shuffle",
            "--eval-data",
            tables[f"eval.{kind}"],
            "--eval-every",
            2,
            "--metric",
            "accuracy",
            "--save-every",
            1,
            "--keep-last",
            2,
            "--save-best",
            "accuracy",
            "--mlflow",
            tmp_path / "mlruns",
            "--output",
            tmp_path / kind / "ckpt",
            "--json",
        )
        assert code == 0, err
        summary = json.loads(out)
        assert summary["last_step"] == 4 and set(summary["eval_metrics"]) == {"loss", "accuracy"}
        assert 0 <= summary["eval_metrics"]["accuracy"] <= 1
        assert sorted(p.name for p in (tmp_path / kind).iterdir()) == [
            "ckpt",
            "ckpt.best",
            "ckpt.options.json",
            "ckpt.step-3",
            "ckpt.step-4",
        ]
        outputs[kind] = (tmp_path / kind / "ckpt").read_bytes()
    assert outputs["parquet"] == outputs["csv"]

    # the API loop: 4 module calls per optimizer step on the same rows in order
    artifacts = tables["artifacts"]
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    scheduler = ConstantWithWarmupLRScheduler(optimizer, 0, 0.001)
    x, labels = tables["x"].reshape(-1, 1, 12, 12), tables["labels"]
    module.train()
    for step in range(4):
        for micro in range(4):
            rows = slice((4 * step + micro) * 8, (4 * step + micro + 1) * 8)
            module(x[rows], labels[rows])
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
    trained = TrainingState.load(tmp_path / "parquet" / "ckpt").state_dict()
    assert all(torch.equal(trained[name], value) for name, value in state.training_state.state_dict().items())

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    [experiment] = [e for e in client.search_experiments() if e.name == "ort-torch-train"]
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    history = client.get_metric_history(runs[0].info.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2, 3, 4]
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "eval/accuracy")] == [2, 4]


@pytest.mark.slow
def test_interrupted_mid_epoch_and_resumed_to_the_same_max_steps_equals_one_run(capsys, tmp_path, tables) -> None:
    common = [
        "train",
        tables["artifacts"],
        "--data",
        tables["train.parquet"],
        "--inputs",
        "input=image,labels=label",
        "--batch-size",
        8,
        "--max-steps",
        26,  # 20 batches per epoch: the run crosses into epoch 2
        "--seed",
        5,
        "--eval-data",
        tables["eval.parquet"],
        "--eval-every",
        7,
        "--metric",
        "tests.integration.test_cli_train_options:interrupting_metric",
        "--save-best",
        "loss",
    ]
    INTERRUPT["armed"] = True
    summary_file = tmp_path / "summary.json"
    code, out, err = run_cli(capsys, *common, "--output", tmp_path / "a" / "ckpt", "--json", "--summary", summary_file)
    assert code == 130 and "interrupted" in err
    summary = json.loads(out)  # the summary comes on Ctrl-C too, printed and written
    assert json.loads(summary_file.read_text()) == summary
    assert summary["interrupted"] is True and summary["last_step"] == 7
    assert TrainingState.load(tmp_path / "a" / "ckpt").properties["ort_torch_train.data_position"] == 7
    resume = [*common, "--resume", tmp_path / "a" / "ckpt", "--workers", 2, "--output", tmp_path / "a" / "ckpt"]
    code, _, err = run_cli(capsys, *resume)  # the saved --summary leaves the checkpoint's folder: named again
    assert code == 2 and "give --summary on the command line" in err
    code, out, err = run_cli(capsys, *resume, "--summary", summary_file)
    assert code == 0, err
    assert "resumed from" in out and "trained steps 8-26" in out
    code, _, err = run_cli(capsys, *common, "--output", tmp_path / "b" / "ckpt", "--quiet")
    assert code == 0, err
    for name in ("ckpt", "ckpt.best"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    code, out, _ = run_cli(capsys, *common, "--resume", tmp_path / "b" / "ckpt", "--output", tmp_path / "c")
    assert code == 0 and "already at step 26" in out  # --max-steps is a total: repeating it trains nothing


@pytest.mark.slow
def test_mixed_precision_recompute_early_stop_and_the_summary_file(capsys, tmp_path, cnn_data) -> None:
    artifacts, data = cnn_data
    code, out, err = run_cli(
        capsys,
        "train",
        artifacts,
        "--data",
        data,
        "--batch-size",
        8,
        "--max-steps",
        10,
        "--mixed-precision",
        "bf16",
        "--recompute",
        2,
        "--eval-data",
        data,
        "--eval-every",
        1,
        "--metric",
        "tests.unit.trainer.test_fit:steady_metric",
        "--early-stop",
        1,
        "--summary",
        tmp_path / "run" / "summary.json",
        "--output",
        tmp_path / "ckpt",
        "--quiet",
    )
    assert code == 0 and out == "", err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["last_step"] == 2 and summary["stopped"].startswith("early stop: steady_metric")
    assert summary["eval_metrics"]["steady_metric"] == 1.0 and summary["skipped_steps"] == 0
    assert TrainingState.load(tmp_path / "ckpt").optimizer.step == 2
