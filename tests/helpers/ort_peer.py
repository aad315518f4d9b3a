"""Run code under onnxruntime-training 1.19.2 (the reference) in its own virtualenv.

ORT lives in a separate venv (its numpy/onnx pins clash with ours), so tests hand it a script to run
in a subprocess. ``ORT_TRAINING_PYTHON`` overrides the interpreter (default: ``.venv-ort/bin/python``
in the repository). Use ``requires_ort`` as ``pytestmark`` (or a decorator list) to skip cleanly
where it is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

ORT_PYTHON = Path(os.environ.get("ORT_TRAINING_PYTHON", ROOT / ".venv-ort" / "bin" / "python"))

requires_ort = [
    pytest.mark.ort_peer,
    pytest.mark.skipif(not ORT_PYTHON.exists(), reason=f"no onnxruntime-training python at {ORT_PYTHON}"),
]


def run_ort(script: str, *args: str | os.PathLike, timeout: float | None = None) -> object:
    """Run script (Python source) under ORT's interpreter with args as sys.argv[1:].

    The script must print one JSON value as the last line of its stdout; it is returned. A failing
    script fails the calling test with its stderr.
    """
    result = subprocess.run(
        [str(ORT_PYTHON), "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout or scaled(300),
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"ORT script failed ({result.returncode}):\n{result.stderr[-4000:]}")
    lines = result.stdout.strip().splitlines()
    if not lines:
        pytest.fail(f"ORT script printed nothing; stderr:\n{result.stderr[-4000:]}")
    return json.loads(lines[-1])
