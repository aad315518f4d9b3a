"""The ``ort-torch-train`` command line on ORT-made artifacts: inspect, train (ORT parity, resume),
convert round trips, and one-line errors for every user mistake."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.checkpoint.records import CheckpointRecord
from ort_torch_train.cli.main import main
from ort_torch_train.state.training_state import TrainingState
from tests.helpers.paths import FIXTURES, REFCORPUS


def ort_case(*names: str) -> Path:
    """The first ORT case folder of these names in tests/fixtures, then in the reference corpus."""
    for root in (FIXTURES, REFCORPUS):
        for name in names:
            if (root / name / "artifacts").is_dir():
                return root / name
    pytest.skip(f"no ORT case {names} present")


@pytest.fixture
def cnn() -> Path:
    return ort_case("cnn")


def run_cli(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of one in-process run."""
    try:
        code = main([str(arg) for arg in args])
    except SystemExit as exit:  # argparse: --help, usage errors
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parameters(checkpoint: Path) -> dict[str, torch.Tensor]:
    return TrainingState.load(checkpoint).state_dict()


def sample_major_npz(case: Path, path: Path) -> Path:
    """The case's batched training data flattened to [samples, ...], keyed by the model's input names."""
    names = json.loads((case / "expected.json").read_text())["train_mode"]["input_names"]
    with np.load(case / "data.npz") as data:
        arrays = [data["x_train"], data["y_train"]]
    np.savez(path, **{name: array.reshape(-1, *array.shape[2:]) for name, array in zip(names, arrays)})
    return path


# ---- help -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], ["inspect"], ["train"], ["convert"]])
def test_help_describes_and_shows_examples(capsys, command) -> None:
    code, out, _ = run_cli(capsys, *command, "--help")
    assert code == 0
    assert "examples:" in out and "ort-torch-train" in out


@pytest.mark.slow
def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "ort_torch_train", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ort-torch-train 0.1.0"


# ---- inspect ----------------------------------------------------------------------------------------
def test_inspect_text_lists_inputs_parameters_optimizer_checkpoint(capsys, cnn) -> None:
    code, out, err = run_cli(capsys, "inspect", cnn / "artifacts")
    assert code == 0, err
    assert re.search(r"input\s+input\s+float32\s+\[batch, 1, 12, 12\]", out)
    assert re.search(r"input\s+labels\s+int64\s+\[batch\]", out)
    assert re.search(r"0\.weight\s+float32\s+\[4, 1, 3, 3\]\s+trainable", out)
    assert "optimizer: AdamW" in out and "epsilon 1e-06" in out
    assert "checkpoint: complete" in out and "optimizer state: none" in out


def test_inspect_json_matches_what_ort_recorded(capsys, cnn) -> None:
    expected = json.loads((cnn / "expected.json").read_text())
    code, out, _ = run_cli(capsys, "inspect", cnn / "artifacts", "--json")
    report = json.loads(out)
    assert code == 0
    training = report["training_model"]
    assert [v["name"] for v in training["inputs"]] == expected["train_mode"]["input_names"]
    assert [v["name"] for v in training["outputs"]] == expected["train_mode"]["output_names"]
    assert {
        p["name"]: {"requires_grad": p["trainable"], "shape": p["shape"], "dtype": p["dtype"]}
        for p in report["parameters"]
    } == expected["parameters"]
    assert report["optimizer"]["algorithm"] == "AdamW"
    assert report["optimizer"]["hyperparameters"]["beta2"] == 0.999
    assert report["checkpoint"] == {"nominal": False, "external_data": False, "optimizer_groups": [], "properties": {}}


def test_inspect_individual_files_and_a_saved_checkpoint(capsys, cnn) -> None:
    files = [
        cnn / "artifacts" / "optimizer_model.onnx",
        cnn / "artifacts" / "training_model.onnx",
        cnn / "final_checkpoint_with_optimizer",
    ]
    code, out, _ = run_cli(capsys, "inspect", *files, "--json")
    report = json.loads(out)
    assert code == 0
    assert set(report["files"]) == {"optimizer_model", "training_model", "checkpoint"}
    [group] = report["checkpoint"]["optimizer_groups"]
    assert group["step"] == 20 and group["moments"] == ["momentum0", "momentum1"]


# ---- train ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_train_replays_ort_scheduled_run(capsys, tmp_path, compiled) -> None:
    """ORT's 20 steps with LinearLRScheduler(warmup 3, total 20): same parameters, same eval loss."""
    case = ort_case("mlp_ce_adamw_sched")
    expected = json.loads((case / "expected.json").read_text())
    data = case / "data.npz"
    code, out, err = run_cli(
        capsys,
        "train",
        case / "artifacts",
        "--data",
        data,
        "--inputs",
        "x_train,y_train",
        "--batched",
        "--no-shuffle",
        "--steps",
        20,
        "--lr",
        0.01,
        "--schedule",
        "linear",
        "--warmup",
        3,
        "--eval-data",
        data,
        "--eval-inputs",
        "x_eval,y_eval",
        "--output",
        tmp_path / "trained",
        *(["--compile"] if compiled else []),
    )
    assert code == 0, err
    assert "20/20" in err  # the progress bar
    assert ("s compiling" in out) == compiled  # the rate excludes compilation, reported on its own
    assert f"eval loss {expected['train']['eval_loss']:.4g} on 16 samples" in out
    with np.load(case / "arrays.npz") as arrays:
        for name, value in parameters(tmp_path / "trained").items():
            np.testing.assert_allclose(value.numpy(), arrays[f"final__{name}"], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_train_then_resume_equals_one_uninterrupted_run(capsys, tmp_path, cnn) -> None:
    data = sample_major_npz(cnn, tmp_path / "train.npz")
    common = ["train", cnn / "artifacts", "--data", data, "--batch-size", 8, "--lr", 0.01]
    assert run_cli(capsys, *common, "--steps", 5, "--output", tmp_path / "first")[0] == 0
    code, out, err = run_cli(
        capsys, *common, "--steps", 3, "--resume", tmp_path / "first", "--output", tmp_path / "second"
    )
    assert code == 0, err
    assert "resumed from" in out and "at step 5" in out and "trained steps 6-8" in out
    assert run_cli(capsys, *common, "--steps", 8, "--output", tmp_path / "whole")[0] == 0
    # parameters, moments, step count and learning rate: the same bytes
    assert (tmp_path / "second").read_bytes() == (tmp_path / "whole").read_bytes()
    code, out, _ = run_cli(capsys, "inspect", tmp_path / "second", "--json")
    [group] = json.loads(out)["checkpoint"]["optimizer_groups"]
    assert group["step"] == 8 and group["initial_lr"] == 0.01


def test_train_shows_its_input_checks_on_a_terminal_before_the_conversion(capsys, monkeypatch, tmp_path, cnn) -> None:
    data = sample_major_npz(cnn, tmp_path / "train.npz")
    train = ["train", cnn / "artifacts", "--data", data, "--batch-size", 8, "--steps", 1]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # capsys's stream, as a terminal
    code, _, err = run_cli(capsys, *train, "--output", tmp_path / "out")
    assert code == 0, err
    lines = [line.strip() for line in re.split(r"[\r\n]", err) if line.strip()]

    def where(start: str) -> int:
        return next(i for i, line in enumerate(lines) if line.startswith(start) and line.endswith(" s"))

    started = lines.index("reading the artifacts and the data and checking them against the models ...")
    assert (
        started < where("read the artifacts and the data and checked them ") < where("converted the training graph in ")
    )
    assert not any(line.startswith("loaded checkpoint") for line in lines), lines  # within the checks: logged only
    code, _, err = run_cli(capsys, *train, "--output", tmp_path / "quiet", "--quiet")
    assert code == 0 and "checked them" not in err, err


# ---- convert ----------------------------------------------------------------------------------------
def test_convert_round_trip_ort_safetensors_pt_ort(capsys, tmp_path, cnn) -> None:
    source = cnn / "final_checkpoint_with_optimizer"
    hops = [
        (source, tmp_path / "model.safetensors"),
        (tmp_path / "model.safetensors", tmp_path / "model.pt"),
        (tmp_path / "model.pt", tmp_path / "checkpoint"),
    ]
    for src, dst in hops:
        code, _, err = run_cli(capsys, "convert", src, dst, "--template", source)
        assert code == 0, err
    original = parameters(source)
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert list(loaded) == list(original)
    back = TrainingState.load(tmp_path / "checkpoint")
    assert all(torch.equal(back.params[name].detach(), value) for name, value in original.items())
    assert back.trainable_names() == TrainingState.load(source).trainable_names()
    assert back.optimizer is None  # optimizer state belongs to the template's values, not carried over
    if (cnn / "final_checkpoint_no_optimizer").is_file():  # what ORT itself saved without optimizer state
        assert (tmp_path / "checkpoint").read_bytes() == (cnn / "final_checkpoint_no_optimizer").read_bytes()


def test_convert_with_explicit_formats_and_a_nominal_template(capsys, tmp_path) -> None:
    case = ort_case("mlp_ce_adamw_sched", "mlp")
    weights = tmp_path / "weights.bin"
    assert run_cli(capsys, "convert", case / "artifacts" / "checkpoint", weights, "--to", "pt")[0] == 0
    code, _, err = run_cli(
        capsys,
        "convert",
        weights,
        tmp_path / "complete",
        "--from",
        "pt",
        "--template",
        case / "artifacts" / "nominal_checkpoint",
    )
    assert code == 0, err
    state = TrainingState.load(tmp_path / "complete")
    assert not state.is_nominal
    original = parameters(case / "artifacts" / "checkpoint")
    assert all(torch.equal(state.params[name].detach(), value) for name, value in original.items())


# ---- errors: one line, non-zero exit, no traceback ----------------------------------------------------
@pytest.fixture
def bad_inputs(tmp_path, cnn) -> dict[str, Path]:
    """Paths for the error cases: the cnn case, good and broken data, broken and mismatched files."""
    data = sample_major_npz(cnn, tmp_path / "good.npz")
    with np.load(data) as arrays:
        x, labels = arrays["input"], arrays["labels"]
    np.savez(tmp_path / "f64.npz", input=x.astype(np.float64), labels=labels)
    np.savez(tmp_path / "shape.npz", input=x[:, :, :10, :10].copy(), labels=labels)
    np.savez(tmp_path / "lengths.npz", input=x, labels=labels[:5])
    (tmp_path / "garbage").write_bytes(b"not a checkpoint")
    (tmp_path / "garbage.onnx").write_bytes(b"not a model")
    (tmp_path / "garbage.pt").write_bytes(b"not a pickle")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00" * 4)
    (tmp_path / "empty").mkdir()
    weights = parameters(cnn / "artifacts" / "checkpoint")
    torch.save(weights, tmp_path / "weights.pt")
    torch.save({("x" + name): value for name, value in weights.items()}, tmp_path / "renamed.pt")
    torch.save({name: value.reshape(-1) for name, value in weights.items()}, tmp_path / "reshaped.pt")
    torch.save({name: value.double() for name, value in weights.items()}, tmp_path / "f64.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    nominal = {name: torch.empty(0) for name in weights}
    TrainingState.from_record(CheckpointRecord(nominal, {}, is_nominal=True)).save(tmp_path / "nominal")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pa_parquet

    pa_parquet.write_table(pa.table({"image": list(x.reshape(len(x), -1)), "label": labels}), tmp_path / "t.parquet")
    other = FIXTURES / "mlp_frozen" / "artifacts" / "checkpoint"  # another model's parameters
    return {"tmp": tmp_path, "case": cnn, "artifacts": cnn / "artifacts", "good": data, "other": other}


TRAIN = ["train", "{artifacts}", "--data", "{good}", "--steps", "1", "--output", "{tmp}/out"]
ERRORS = {
    "inspect-missing": (["inspect", "{tmp}/nope"], "not found"),
    "inspect-empty-folder": (["inspect", "{tmp}/empty"], "holds none of"),
    "inspect-case-folder": (["inspect", "{case}"], "did you mean"),
    "inspect-folder-among-files": (["inspect", "{artifacts}/checkpoint", "{tmp}/empty"], "is a folder"),
    "inspect-garbage-checkpoint": (["inspect", "{tmp}/garbage"], "not a readable ORT checkpoint"),
    "inspect-garbage-onnx": (["inspect", "{tmp}/garbage.onnx"], "not a readable ONNX model"),
    "train-missing-folder": (["train", "{tmp}/nope", "--data", "{good}", "--steps", "1"], "not found"),
    "train-missing-data": (["train", "{artifacts}", "--data", "{tmp}/nope.npz", "--steps", "1"], "data file not found"),
    "train-data-not-npz": (["train", "{artifacts}", "--data", "{tmp}/garbage", "--steps", "1"], "not a readable .npz"),
    "train-unmatched-names": (
        ["train", "{artifacts}", "--data", "{case}/data.npz", "--steps", "1"],
        "no array named 'input'",
    ),
    "train-inputs-count": ([*TRAIN, "--inputs", "input"], "names 1 arrays but the model has 2 inputs"),
    "train-inputs-unknown": ([*TRAIN, "--inputs", "input,nope"], "has no array 'nope'"),
    "train-dtype": (
        ["train", "{artifacts}", "--data", "{tmp}/f64.npz", "--steps", "1"],
        "is float64, the model expects float32",
    ),
    "train-shape": (
        ["train", "{artifacts}", "--data", "{tmp}/shape.npz", "--steps", "1"],
        "dimension 2 is 10, expected 12",
    ),
    "train-batched-data-without-flag": (
        ["train", "{artifacts}", "--data", "{case}/data.npz", "--inputs", "x_train,y_train", "--steps", "1"],
        "need --batched",
    ),
    "train-lengths": (["train", "{artifacts}", "--data", "{tmp}/lengths.npz", "--steps", "1"], "differ in length"),
    "train-batch-too-large": ([*TRAIN, "--batch-size", "100000"], "fewer than the batch size"),
    "train-resume-missing": ([*TRAIN, "--resume", "{tmp}/nope"], "checkpoint to resume not found"),
    "train-resume-nominal": ([*TRAIN, "--resume", "{tmp}/nominal"], "nominal checkpoint"),
    "train-eval-dtype": ([*TRAIN, "--eval-data", "{tmp}/f64.npz"], "is float64"),
    "train-device": ([*TRAIN, "--device", "tpu"], "device"),
    "train-warmup-too-long": ([*TRAIN, "--schedule", "linear", "--warmup", "5"], "exceeds"),
    "train-zero-steps": (["train", "{artifacts}", "--data", "{good}", "--steps", "0"], "positive integer"),
    "train-negative-lr": ([*TRAIN, "--lr", "-1"], ">= 0"),
    "train-no-length": (["train", "{artifacts}", "--data", "{good}"], "--steps"),
    "train-seed-too-large": ([*TRAIN, "--seed", str(2**70)], "expected an integer from 0 to 2**63 - 1"),
    "train-resume-other-model": ([*TRAIN, "--resume", "{other}"], "is not a checkpoint of these artifacts"),
    "train-bad-parquet": (["train", "{artifacts}", "--data", "{tmp}/bad.parquet", "--steps", "1"], "not a readable"),
    "train-missing-column": (["train", "{artifacts}", "--data", "{tmp}/t.parquet", "--steps", "1"], "no column named"),
    "train-unknown-column": (
        [*TRAIN[:3], "{tmp}/t.parquet", *TRAIN[4:], "--inputs", "input=im*,labels=y"],
        "no column",
    ),
    "train-mapping": ([*TRAIN, "--inputs", "image=input"], "is not INPUT=KEY"),
    "train-keep-last-alone": ([*TRAIN, "--keep-last", "2"], "--keep-last keeps the newest periodic"),
    "train-best-without-eval": ([*TRAIN, "--save-best", "loss"], "--save-best evaluates"),
    "train-best-unknown": ([*TRAIN, "--eval-data", "{good}", "--save-best", "accuracy"], "expected an evaluated"),
    "train-bad-metric": ([*TRAIN, "--eval-data", "{good}", "--metric", "nope"], "metric: expected one of"),
    "train-batched-table": ([*TRAIN[:3], "{tmp}/t.parquet", *TRAIN[4:], "--batched"], "--batched reads"),
    "train-recompute": ([*TRAIN, "--recompute", "1"], "segment count >= 2"),
    "convert-missing": (["convert", "{tmp}/nope", "{tmp}/x.pt"], "source not found"),
    "convert-needs-template": (["convert", "{tmp}/weights.pt", "{tmp}/checkpoint"], "needs --template"),
    "convert-same-format": (["convert", "{tmp}/weights.pt", "{tmp}/copy.pth"], "nothing to convert"),
    "convert-nominal-source": (["convert", "{tmp}/nominal", "{tmp}/x.pt"], "nominal"),
    "convert-names": (["convert", "{tmp}/renamed.pt", "{tmp}/ck", "--template", "{artifacts}"], "do not match"),
    "convert-shape": (["convert", "{tmp}/reshaped.pt", "{tmp}/ck", "--template", "{artifacts}"], "has shape"),
    "convert-dtype": (["convert", "{tmp}/f64.pt", "{tmp}/ck", "--template", "{artifacts}"], "is float64"),
    "convert-not-a-state-dict": (["convert", "{tmp}/list.pt", "{tmp}/x.safetensors"], "does not hold a state_dict"),
    "convert-pickled-module": (["convert", "{tmp}/module.pt", "{tmp}/x.safetensors"], "model.state_dict()"),
    "convert-garbage-pt": (["convert", "{tmp}/garbage.pt", "{tmp}/x.safetensors"], "not a file written by torch.save"),
    "convert-garbage-safetensors": (["convert", "{tmp}/garbage.safetensors", "{tmp}/x.pt"], "safetensors"),
    "convert-unknown-format": (["convert", "{tmp}/weights.pt", "{tmp}/x", "--to", "onnx"], "invalid choice"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_user_errors_are_one_line_without_traceback(capsys, bad_inputs, name) -> None:
    template, fragment = ERRORS[name]
    code, out, err = run_cli(capsys, *[arg.format(**bad_inputs) for arg in template])
    assert code not in (0, None)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.match(r"ort-torch-train( \w+)?: error: ", lines[0]), lines[0]
    assert fragment in lines[0]
    assert "Traceback" not in err and out == ""


def test_train_reads_ort_format_artifacts_as_the_onnx_ones(capsys, tmp_path) -> None:
    """A folder of ORT-format (.ort) models beside the checkpoint trains to the same bytes as the ONNX one."""
    case = FIXTURES / "mlp_ce_adamw_sched"
    ort_folder = tmp_path / "ort_artifacts"
    ort_folder.mkdir()
    for model in (case / "artifacts_ort").glob("*.ort"):
        (ort_folder / model.name).write_bytes(model.read_bytes())
    (ort_folder / "checkpoint").write_bytes((case / "artifacts" / "checkpoint").read_bytes())
    code, out, err = run_cli(capsys, "inspect", ort_folder, "--json")
    assert code == 0, err
    assert set(json.loads(out)["files"]) == {"training_model", "eval_model", "optimizer_model", "checkpoint"}
    data = case / "data.npz"
    common = ["--data", data, "--inputs", "x_train,y_train", "--batched", "--no-shuffle", "--steps", 5]
    for name, folder in (("onnx", case / "artifacts"), ("ort", ort_folder)):
        code, out, err = run_cli(capsys, "train", folder, *common, "--output", tmp_path / name)
        assert code == 0, err
    assert (tmp_path / "ort").read_bytes() == (tmp_path / "onnx").read_bytes()
