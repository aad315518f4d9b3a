"""docs/cli.md's worked example runs as written: the Parquet files it makes, then its two train commands, then
the page's `inspect` and `--batched` examples on what it made; no shell example of the CLI or scaling pages
names a file of the checkout (they run from an installed wheel too: tests/integration/test_install.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from ort_torch_train.state.training_state import TrainingState
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled
from tests.unit.cli.test_cli import run_cli


def worked_example() -> tuple[str, list[str]]:
    """The example's data-making command and its train commands."""
    section = (ROOT / "docs" / "cli.md").read_text().split("### Worked example", 1)[1].split("\n### ", 1)[0]
    make_data = re.findall(r"```\n(python -c .*?)```", section, flags=re.DOTALL)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0].strip().splitlines()
    return make_data, commands


def _section(page: str, heading: str) -> str:
    return (ROOT / "docs" / page).read_text().split(heading + "\n", 1)[1].split("\n#", 1)[0]


def _joined(block: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
    lines = block.replace("\\\n", " ").splitlines()
    return [" ".join(line.split("#", 1)[0].split()) for line in lines if line.split("#", 1)[0].strip()]


def inspect_example() -> tuple[list[str], list[str]]:
    """docs/cli.md's `inspect` example: its command and the output lines it shows (elisions left out)."""
    block = re.findall(r"```\n\$ (.*?)```", _section("cli.md", "## inspect"), flags=re.DOTALL)[0]
    command, *shown = block.splitlines()
    return shlex.split(command), [line for line in shown if line.strip() != "..."]


def inspect_output_matches(shown: list[str], output: str) -> list[str]:
    """The shown lines that the real output lacks (a line ending in '...' need only start one)."""
    real = [" ".join(line.split()) for line in output.splitlines()]
    missing = []
    for line in shown:
        want = " ".join(line.split())
        found = any(r.startswith(want[:-3]) for r in real) if want.endswith("...") else want in real
        if not found:
            missing.append(line)
    return missing


def batched_example() -> list[str]:
    """docs/cli.md's `--batched` command (it trains on the worked example's `cnn-batched.npz`)."""
    blocks = re.findall(r"```\n(ort-torch-train train .*?)```", _section("cli.md", "### Data"), flags=re.DOTALL)
    (command,) = [line for block in blocks for line in _joined(block) if "--batched" in line]
    return shlex.split(command)


def torchrun_example() -> list[str]:
    """docs/scaling.md's data-parallel CLI command (the worked example's artifacts and data)."""
    first = re.findall(r"```sh\n(.*?)```", _section("scaling.md", "## Data parallel"), flags=re.DOTALL)[0]
    (command,) = [line for line in _joined(first) if "-m ort_torch_train train" in line]
    return shlex.split(command)


def test_no_shell_example_of_the_cli_pages_names_a_checkout_file() -> None:
    make_data, commands = worked_example()
    examples = [make_data, *commands, " ".join(inspect_example()[0]), " ".join(batched_example())]
    examples.append(" ".join(torchrun_example()))
    assert not [example for example in examples if "tests/" in example or "fixtures" in example], examples


@pytest.mark.slow
def test_the_worked_example_runs(capsys, tmp_path, monkeypatch) -> None:
    pytest.importorskip("pyarrow")
    make_data, commands = worked_example()
    code = shlex.split(make_data)[2]
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=scaled(120))
    monkeypatch.chdir(tmp_path)
    first, second = (shlex.split(command) for command in commands)
    assert first[0] == second[0] == "ort-torch-train"
    status, out, err = run_cli(capsys, *first[1:])
    assert status == 0, err
    assert "step 4: best accuracy" in out and "step 4: checkpoint saved to run/ckpt" in out
    assert "trained steps 1-12" in out and "eval accuracy" in out and "best checkpoint: run/ckpt.best" in out
    files = sorted(path.name for path in (tmp_path / "run").iterdir())
    assert files == ["ckpt", "ckpt.best", "ckpt.options.json", "ckpt.step-12", "ckpt.step-8", "metrics.jsonl"]
    status, out, err = run_cli(capsys, *second[1:])
    assert status == 0, err
    assert "resumed from run/ckpt at step 12" in out and "trained steps 13-16" in out
    assert TrainingState.load(tmp_path / "run" / "ckpt").optimizer.step == 16
    command, shown = inspect_example()
    assert command[0] == "ort-torch-train"
    status, out, err = run_cli(capsys, *command[1:])
    assert status == 0, err
    assert not inspect_output_matches(shown, out), out
    command = batched_example()
    status, out, err = run_cli(capsys, *command[1:])
    assert status == 0, err
    assert "trained steps 1-20" in out and "eval loss" in out
