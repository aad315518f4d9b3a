"""The Python examples of docs/training-loop.md run as written, in order, on the cnn fixture."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.paths import FIXTURES, ROOT


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "training-loop.md").read_text(), flags=re.DOTALL)


@pytest.mark.slow
def test_training_loop_examples_run(tmp_path) -> None:
    (tmp_path / "artifacts").symlink_to(FIXTURES / "cnn" / "artifacts")
    with np.load(FIXTURES / "cnn" / "data.npz") as data:
        np.savez(
            tmp_path / "data.npz", input=data["x_train"].reshape(-1, 1, 12, 12), labels=data["y_train"].reshape(-1)
        )
    blocks = python_blocks()
    assert len(blocks) == 4
    result = subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 28: loss" in result.stdout
    assert (tmp_path / "run" / "ckpt").is_file() and (tmp_path / "run" / "ckpt.best").is_file()
    assert len(list((tmp_path / "run").glob("ckpt.step-*"))) == 2
