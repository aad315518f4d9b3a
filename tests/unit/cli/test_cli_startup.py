"""The command line answers before torch and onnx load: `--help`, `--version` and usage errors import
neither (checked with ``python -X importtime``), and run in a venv that has no torch at all, where a
command that needs torch says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

HEAVY = ("torch", "onnx", "numpy", "onnx2torch")


def _cli(python: str | Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(120), check=False
    )


def imported_packages(importtime_stderr: str) -> set[str]:
    """The top-level packages ``-X importtime`` reports as imported."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                names.add(name.partition(".")[0])
    return names


@pytest.mark.parametrize(
    ("args", "status"),
    [(["--help"], 0), (["--version"], 0), (["train", "--help"], 0), (["train"], 2), (["nosuchcommand"], 2)],
)
def test_help_version_and_usage_errors_import_neither_torch_nor_onnx(args: list[str], status: int) -> None:
    done = _cli(sys.executable, "-X", "importtime", "-m", "ort_torch_train", *args)
    assert done.returncode == status, done.stderr[-2000:]
    imported = imported_packages(done.stderr)
    assert "ort_torch_train" in imported  # the report is read
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh venv (no site packages: no torch, onnx or numpy) with the checkout on its path."""
    venv = tmp_path_factory.mktemp("venv-without-torch")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=scaled(120))
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(ROOT)
    probe = _cli(python, "-c", "import torch", env=env)
    assert probe.returncode != 0, "the venv without torch imports torch"
    return python, env


def test_help_version_and_usage_errors_work_without_torch(python_without_torch) -> None:
    python, env = python_without_torch
    done = _cli(python, "-m", "ort_torch_train", "--help", env=env)
    assert done.returncode == 0, done.stderr
    assert "inspect" in done.stdout and "evaluate" in done.stdout and "generate" in done.stdout
    done = _cli(python, "-m", "ort_torch_train", "--version", env=env)
    assert done.returncode == 0 and done.stdout.startswith("ort-torch-train "), done.stderr
    done = _cli(python, "-m", "ort_torch_train", "train", "artifacts", env=env)
    assert done.returncode == 2 and "the following arguments are required" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_command_that_needs_torch_says_so_without_a_traceback(python_without_torch, tmp_path: Path) -> None:
    python, env = python_without_torch
    done = _cli(python, "-m", "ort_torch_train", "train", str(tmp_path), "--data", "d.npz", "--steps", "1", env=env)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("ort-torch-train: error: `ort-torch-train train` needs ")
    assert "pip install" in done.stderr


def test_tomli_is_declared_for_python_before_3_11() -> None:
    tomllib = pytest.importorskip("tomllib")  # the declaration is read with Python 3.11's parser
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (tomli,) = [Requirement(text) for text in declared if Requirement(text).name == "tomli"]
    assert tomli.marker is not None
    assert tomli.marker.evaluate({"python_version": "3.10"})
    assert not tomli.marker.evaluate({"python_version": "3.11"})
