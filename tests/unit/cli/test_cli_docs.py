"""docs/cli.md's worked example runs as written: the Parquet files it makes, then its two train commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from ort_torch_train.state.training_state import TrainingState
from tests.helpers.paths import ROOT
from tests.unit.cli.test_cli import run_cli


def worked_example() -> tuple[str, list[str]]:
    """The example's data-making command and its train commands."""
    section = (ROOT / "docs" / "cli.md").read_text().split("### Worked example", 1)[1].split("\n### ", 1)[0]
    make_data = re.findall(r"```\n(python -c .*?)```", section, flags=re.DOTALL)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0].strip().splitlines()
    return make_data, commands


@pytest.mark.slow
def test_the_worked_example_runs(capsys, tmp_path, monkeypatch) -> None:
    pytest.importorskip("pyarrow")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    make_data, commands = worked_example()
    code = shlex.split(make_data)[2]
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=120)
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
