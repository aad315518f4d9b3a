"""``ort-torch-train inspect ... | head -1``: the command stops quietly when its reader goes away."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled


@pytest.mark.slow
def test_a_closed_stdout_ends_the_command_quietly() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line, as after `head -1`'s line
    command = [sys.executable, "-m", "ort_torch_train", "inspect", str(FIXTURES / "cnn" / "artifacts")]
    try:
        done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=scaled(60))
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""
