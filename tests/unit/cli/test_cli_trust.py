"""``train`` fails before training on what it would otherwise find late (an output it cannot write, a
schedule shorter than the run, an empty eval file) and treats a finished run alike under every schedule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.unit.cli.test_cli import ort_case, run_cli, sample_major_npz


@pytest.fixture(scope="module")
def cnn_data(tmp_path_factory) -> tuple[Path, Path]:
    case = ort_case("cnn")
    return case / "artifacts", sample_major_npz(case, tmp_path_factory.mktemp("data") / "train.npz")


def train(capsys, cnn_data, *options: object) -> tuple[int, str, str]:
    artifacts, data = cnn_data
    return run_cli(capsys, "train", artifacts, "--data", data, "--batch-size", 8, "--quiet", *options)


def test_an_output_that_cannot_be_written_is_refused_before_training(capsys, tmp_path, cnn_data) -> None:
    (tmp_path / "file").write_bytes(b"")
    for output, expected in ((tmp_path / "file" / "ckpt", "--output"), (tmp_path, "--output.*directory")):
        code, _, err = train(capsys, cnn_data, "--steps", 2, "--output", output, "--metrics", tmp_path / "m.jsonl")
        assert code == 1 and err.count("\n") == 1
        assert __import__("re").search(expected, err), err
        assert not (tmp_path / "m.jsonl").exists()  # refused before the run began


def test_a_schedule_shorter_than_the_run_is_refused(capsys, tmp_path, cnn_data) -> None:
    code, _, err = train(capsys, cnn_data, "--max-steps", 4, "--total-steps", 2, "--output", tmp_path / "c")
    assert code == 1 and "--total-steps 2" in err and "4" in err
    assert not (tmp_path / "c").exists()


def test_a_finished_run_resumed_says_nothing_to_train_under_every_schedule(capsys, tmp_path, cnn_data) -> None:
    code, _, err = train(capsys, cnn_data, "--max-steps", 2, "--output", tmp_path / "c")
    assert code == 0, err
    for schedule in ("linear", "cosine", "constant"):
        artifacts, data = cnn_data
        code, out, err = run_cli(
            capsys, "train", artifacts, "--data", data, "--batch-size", 8, "--max-steps", 2,
            "--schedule", schedule, "--resume", tmp_path / "c", "--output", tmp_path / "c",
        )  # fmt: skip
        assert code == 0 and "already at step 2: nothing to train" in out, (schedule, err)


def test_an_eval_file_without_rows_is_a_clear_error(capsys, tmp_path, cnn_data) -> None:
    with np.load(cnn_data[1]) as arrays:
        np.savez(tmp_path / "empty.npz", **{name: arrays[name][:0] for name in arrays.files})
    code, _, err = train(
        capsys, cnn_data, "--steps", 1, "--eval-data", tmp_path / "empty.npz", "--output", tmp_path / "c"
    )
    assert code == 1 and "holds no samples" in err and "empty.npz" in err, err


def test_a_run_that_stopped_early_stays_stopped_when_resumed(capsys, tmp_path, cnn_data) -> None:
    artifacts, data = cnn_data
    early = ["--eval-data", data, "--eval-every", 1, "--metric", "tests.unit.trainer.test_fit:steady_metric"]
    code, _, err = train(capsys, cnn_data, "--max-steps", 10, *early, "--early-stop", 1, "--output", tmp_path / "c")
    assert code == 0, err
    saved = (tmp_path / "c").read_bytes()
    code, out, err = run_cli(
        capsys, "train", artifacts, "--data", data, "--batch-size", 8, "--max-steps", 10, *early,
        "--early-stop", 1, "--resume", tmp_path / "c", "--output", tmp_path / "c",
    )  # fmt: skip
    assert code == 0, err
    assert "nothing to train" in out and "stopped early at step 2" in out
    assert (tmp_path / "c").read_bytes() == saved
