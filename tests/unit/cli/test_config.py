"""``train --config``: file options become flags before the command line's (which win), saved options
come below them, length options from a higher layer replace a lower one's, unknown keys are refused."""

from __future__ import annotations

import json
import time

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


def test_a_yaml_alias_bomb_is_refused_at_once_with_a_short_message(tmp_path) -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    lines.append("inputs: *i")
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")  # 9**9 strings once expanded
    assert (tmp_path / "bomb.yaml").stat().st_size < 600
    started = time.perf_counter()
    with pytest.raises(CliError, match=r"line 2: the YAML alias \*a is not allowed") as refused:
        expand_config(["train", "--config", str(tmp_path / "bomb.yaml")], build_parser())
    assert time.perf_counter() - started < 1 and len(str(refused.value)) < 300


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("twice.yaml", "lr: 0.1\nsteps: 2\nlr: 0.2\n", r"line 3: the key 'lr' is given twice"),
        ("twice.json", '{"lr": 0.1, "lr": 0.2}', r"the key 'lr' is given twice"),
        ("twice.toml", "lr = 0.1\nlr = 0.2\n", r"not a readable toml file"),
        ("spelled.yaml", "max_steps: 3\nmax-steps: 4\n", r"'max_steps' and 'max-steps' set the same option"),
        ("spelled.json", '{"grad-accum": 2, "grad_accum": 3}', r"'grad-accum' and 'grad_accum' set the same option"),
        ("spelled.toml", 'no_shuffle = true\n"no-shuffle" = false\n', r"'no_shuffle' and 'no-shuffle' set the same"),
    ],
)
def test_a_key_given_twice_or_spelled_two_ways_is_refused(tmp_path, name, text, expected) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(CliError, match=expected):
        expand_config(["train", "--config", str(tmp_path / name)], build_parser())


def test_a_config_file_over_a_mebibyte_is_refused(tmp_path) -> None:
    (tmp_path / "big.json").write_text('{"lr": 0.1, "data": "' + "x" * (1 << 20) + '"}')
    with pytest.raises(CliError, match="more than the 1048576 expected"):
        expand_config(["train", "--config", str(tmp_path / "big.json")], build_parser())
