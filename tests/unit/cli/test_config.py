"""``train --config``: file options become flags before the command line's (which win), saved options
come below them, length options from a higher layer replace a lower one's, unknown keys are refused."""

from __future__ import annotations

import json

import pytest

from ort_torch_train.cli.common import CliError
from ort_torch_train.cli.config import expand_config
from ort_torch_train.cli.main import build_parser, main


def test_config_flags_come_first_and_the_command_line_wins(tmp_path) -> None:
    (tmp_path / "run.toml").write_text('artifacts = "a"\ndata = "d.npz"\nmax_steps = 10\nlr = 0.5\nno_shuffle = true\n')
    parser = build_parser()
    argv = expand_config(["train", f"--config={tmp_path / 'run.toml'}", "--lr", "0.1"], parser)
    args = parser.parse_args(argv)
    assert (args.artifacts, args.max_steps, args.lr, args.no_shuffle) == ("a", 10, 0.1, True)
    args = parser.parse_args(
        expand_config(["train", "b", "--config", str(tmp_path / "run.toml"), "--steps", "3"], parser)
    )
    assert (args.artifacts, args.max_steps, args.steps) == ("b", None, 3)  # the file's max_steps gives way


def test_saved_options_come_below_the_config(tmp_path) -> None:
    (tmp_path / "ckpt.options.json").write_text(json.dumps({"artifacts": "a", "data": "d.csv", "lr": 0.2, "epochs": 2}))
    (tmp_path / "run.yaml").write_text("lr: 0.3\n")
    parser = build_parser()
    resume = str(tmp_path / "ckpt")
    args = parser.parse_args(
        expand_config(["train", "--resume", resume, "--config", str(tmp_path / "run.yaml")], parser)
    )
    assert (args.artifacts, args.data, args.lr, args.epochs) == ("a", "d.csv", 0.3, 2)


def test_bad_config_files_are_one_line_errors(tmp_path, capsys) -> None:
    (tmp_path / "typo.yaml").write_text("max_step: 3\n")
    with pytest.raises(CliError, match=r"'max_step' is not an option .*did you mean 'max_steps'"):
        expand_config(["train", "--config", str(tmp_path / "typo.yaml")], build_parser())
    (tmp_path / "bad.toml").write_text("lr = \n")
    assert main(["train", "--config", str(tmp_path / "bad.toml")]) == 2
    assert "is not a readable toml file" in capsys.readouterr().err
    (tmp_path / "run.ini").write_text("")
    assert main(["train", "--config", str(tmp_path / "run.ini")]) == 2
    assert "unknown config format '.ini'" in capsys.readouterr().err
