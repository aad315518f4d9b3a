"""``ort-torch-train -v train`` in a real terminal (tmux): status lines and log records never share a
line with the progress bar, and after ``--resume`` the bar counts from the global step."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled
from tests.unit.cli.test_cli import sample_major_npz

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

BAR = re.compile(r"\d+/\d+ \[")  # tqdm's "n/total [elapsed<remaining, rate]"
STATUS = ("checkpoint saved", "trained steps", "resumed from", "checkpoint with optimizer state", " INFO: ")


def run_in_tmux(command: str, cwd: Path, width: int = 100) -> list[str]:
    """Run ``command`` in a detached tmux session of ``width`` columns; the pane's lines (wrapped ones
    joined) once it has exited."""
    socket, session = f"ott-{uuid.uuid4().hex[:8]}", "train"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    shell = f"{command}; echo EXIT=$?; sleep 60"
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", session, "-x", str(width), "-y", "50", "-c", str(cwd), shell], check=True
    )
    try:
        deadline = time.monotonic() + scaled(90)
        while time.monotonic() < deadline:
            pane = subprocess.run(
                [*tmux, "capture-pane", "-p", "-J", "-S", "-", "-t", session],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            if "EXIT=" in pane:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the command did not finish in tmux:\n{pane}")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    lines = pane.rstrip().splitlines()
    assert "EXIT=0" in pane, pane
    return lines


def test_status_lines_and_bar_in_a_terminal(tmp_path: Path) -> None:
    sample_major_npz(FIXTURES / "cnn", tmp_path / "data.npz")
    train = [sys.executable, "-m", "ort_torch_train", "-v", "train", str(FIXTURES / "cnn" / "artifacts")]
    train += ["--data", "data.npz", "--batch-size", "8", "--save-every", "10", "--output", "run/ckpt"]
    first = shlex.join([*train, "--max-steps", "40"])
    resumed = shlex.join([*train, "--max-steps", "60", "--resume", "run/ckpt"])
    lines = run_in_tmux(f"{first} && {resumed}", tmp_path)
    text = "\n".join(lines)
    for line in lines:
        assert not (BAR.search(line) and any(status in line for status in STATUS)), f"glued:\n{line}\n\n{text}"
    assert sum("checkpoint saved" in line for line in lines) == 6, text
    assert any(line.startswith("resumed from run/ckpt at step 40") for line in lines), text
    bars = [line for line in lines if BAR.search(line)]
    assert any("40/40" in line for line in bars) and any("60/60" in line for line in bars), text
    assert not any(re.search(r"\b\d/20 \[", line) for line in bars), "the resumed bar counts from 0"
