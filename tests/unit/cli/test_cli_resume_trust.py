"""``train --resume`` reads the saved ``OUTPUT.options.json`` as untrusted input: an edited file cannot make
the run write outside its folder (checkpoint, metrics) or import code the command line does not name; and
``--output`` replaces only an ORT checkpoint, never another file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.unit.cli.test_cli import ort_case, run_cli, sample_major_npz

VICTIM = "the user's notes\n"


@pytest.fixture(scope="module")
def cnn_data(tmp_path_factory) -> tuple[Path, Path]:
    case = ort_case("cnn")
    return case / "artifacts", sample_major_npz(case, tmp_path_factory.mktemp("data") / "train.npz")


@pytest.fixture
def saved_run(capsys, tmp_path, cnn_data) -> Path:
    """A finished one-step run whose checkpoint and saved options lie in tmp_path/run."""
    artifacts, data = cnn_data
    output = tmp_path / "run" / "ckpt"
    code, _, err = run_cli(
        capsys, "train", artifacts, "--data", data, "--batch-size", 8, "--steps", 1, "--quiet", "--output", output
    )
    assert code == 0, err
    return output


def edit_options(checkpoint: Path, **changes: object) -> None:
    path = checkpoint.with_name(checkpoint.name + ".options.json")
    options = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({key: value for key, value in options.items() if value is not None}))


def resume(capsys, output: Path, *flags: object) -> tuple[int, str, str]:
    return run_cli(capsys, "train", "--resume", output, "--steps", 1, "--quiet", *flags)


def test_a_resumed_run_repeats_its_saved_options(capsys, saved_run) -> None:
    code, _, err = resume(capsys, saved_run)
    assert code == 0, err
    assert saved_run.is_file()


@pytest.mark.parametrize("key", ["output", "metrics", "summary"])
def test_saved_options_cannot_write_outside_their_folder(capsys, tmp_path, saved_run, key) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    edit_options(saved_run, **{key: str(victim)})
    code, _, err = resume(capsys, saved_run)
    assert code == 2 and f"{key!r} '../victim.txt' leaves the folder" in err and f"give --{key}" in err, err
    assert victim.read_text() == VICTIM
    link = saved_run.parent / "link.txt"  # inside the folder by name, outside by a symlink
    link.symlink_to(victim)
    edit_options(saved_run, **{key: str(link)})
    code, _, err = resume(capsys, saved_run)
    assert code == 2 and "symbolic link" in err, err
    assert victim.read_text() == VICTIM


def test_a_saved_metric_naming_code_is_not_imported_unless_the_command_line_names_it(
    capsys, tmp_path, saved_run, monkeypatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "planted_metric.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\ndef f(outputs, batch):\n    return 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    edit_options(saved_run, metric="planted_metric:f")
    code, _, err = resume(capsys, saved_run)
    assert code == 2 and "'planted_metric:f'" in err and "--metric planted_metric:f" in err, err
    assert not marker.exists() and "planted_metric" not in sys.modules


def test_options_a_run_never_saves_are_refused(capsys, saved_run) -> None:
    for key, value in (("resume", "other"), ("config", "other.yaml")):
        edit_options(saved_run, **{key: value})
        code, _, err = resume(capsys, saved_run)
        assert code == 2 and f"{key!r} is" in err and "did you mean" not in err, err
        edit_options(saved_run, **{key: None})


def test_output_replaces_only_a_checkpoint(capsys, tmp_path, cnn_data) -> None:
    artifacts, data = cnn_data
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    code, _, err = run_cli(
        capsys, "train", artifacts, "--data", data, "--batch-size", 8, "--steps", 1, "--quiet", "--output", victim
    )
    assert code == 1 and "exists and is not an ORT checkpoint" in err and "victim.txt" in err, err
    assert victim.read_text() == VICTIM
