"""The command line answers before torch and onnx load: `--help`, `--version` and usage errors import
neither (checked with ``python -X importtime``), and run in a venv that has no torch at all, where a
command that needs torch says so in one line."""

from __future__ import annotations

import importlib.util
import json
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


# onnx and what it imports, taken from this interpreter's packages into the venv without torch
ONNX_PACKAGES = ("onnx", "numpy", "numpy.libs", "ml_dtypes", "google", "typing_extensions.py")
FIXTURES = ROOT / "tests" / "fixtures"
INSPECTED = [
    [str(FIXTURES / "mlp_ce_adamw_sched" / "artifacts")],
    [str(FIXTURES / "mlp_ce_adamw_sched" / "artifacts"), "--json"],
    [str(FIXTURES / "mlp_ce_adamw_sched" / "artifacts" / "nominal_checkpoint")],
    [str(FIXTURES / "mlp_ce_adamw_sched" / "final_checkpoint_with_optimizer"), "--json"],
    [str(FIXTURES / "regress_mse_sgd" / "artifacts")],
    [str(FIXTURES / "mlp_frozen" / "artifacts"), "--json"],
]


@pytest.fixture(scope="module")
def python_with_onnx_without_torch(python_without_torch) -> tuple[Path, dict[str, str]]:
    """The venv without torch, with onnx (and numpy, protobuf, ml_dtypes, which onnx imports) on its path."""
    python, env = python_without_torch
    site = Path(importlib.util.find_spec("onnx").origin).parent.parent
    packages = python.parent.parent / "onnx-only"
    packages.mkdir(exist_ok=True)
    for name in ONNX_PACKAGES:
        if (site / name).exists() and not (packages / name).exists():
            (packages / name).symlink_to(site / name)
    env = {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(packages)])}
    assert _cli(python, "-c", "import torch", env=env).returncode != 0, "the venv without torch imports torch"
    probe = _cli(python, "-c", "import onnx", env=env)
    assert probe.returncode == 0, probe.stderr[-2000:]
    return python, env


@pytest.mark.parametrize("args", INSPECTED, ids=lambda args: "-".join(Path(arg).name for arg in args))
def test_inspect_imports_no_torch(args: list[str]) -> None:
    done = _cli(sys.executable, "-X", "importtime", "-m", "ort_torch_train", "inspect", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = imported_packages(done.stderr)
    assert "onnx" in imported or "checkpoint" in Path(args[0]).name  # a checkpoint alone needs no onnx model
    assert not imported & {"torch", "onnx2torch", "flatbuffers"}, sorted(imported & {"torch", "onnx2torch"})


# every INSPECTED command run by the command line's main in one process that has imported torch
INSPECT_WITH_TORCH = """
import contextlib, io, json, sys, torch
from ort_torch_train.cli.main import main
reports = []
for args in json.loads(sys.argv[1]):
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(["inspect", *args])
    reports.append({"status": status, "stdout": stdout.getvalue()})
print(json.dumps(reports))
"""


@pytest.fixture(scope="module")
def inspected_with_torch() -> dict[tuple[str, ...], dict]:
    """``{args: {"status", "stdout"}}`` of `inspect` for each of INSPECTED, with torch imported."""
    done = _cli(sys.executable, "-c", INSPECT_WITH_TORCH, json.dumps(INSPECTED))
    assert done.returncode == 0, done.stderr[-2000:]
    return {tuple(args): report for args, report in zip(INSPECTED, json.loads(done.stdout), strict=True)}


@pytest.mark.parametrize("args", INSPECTED, ids=lambda args: "-".join(Path(arg).name for arg in args))
def test_inspect_without_torch_reports_what_it_reports_with_torch(
    python_with_onnx_without_torch, inspected_with_torch, args
) -> None:
    python, env = python_with_onnx_without_torch
    without = _cli(python, "-m", "ort_torch_train", "inspect", *args, env=env)
    assert without.returncode == 0, without.stderr[-2000:]
    with_torch = inspected_with_torch[tuple(args)]
    assert with_torch["status"] == 0, with_torch
    assert without.stdout == with_torch["stdout"]
    assert "parameters" in without.stdout


def test_inspect_without_torch_refuses_a_damaged_checkpoint_as_loading_it_does(
    python_with_onnx_without_torch, tmp_path: Path
) -> None:
    """The walk inspect reads a checkpoint with is the one the torch engine loads it with: the same refusal."""
    python, env = python_with_onnx_without_torch
    data = bytearray((FIXTURES / "mlp_ce_adamw_sched" / "artifacts" / "checkpoint").read_bytes())
    damaged = tmp_path / "checkpoint"
    damaged.write_bytes(data[: len(data) // 2])
    done = _cli(python, "-m", "ort_torch_train", "inspect", str(damaged), env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "is not a readable ORT checkpoint" in done.stderr
    from ort_torch_train.errors import CheckpointError
    from ort_torch_train.state.training_state import TrainingState

    with pytest.raises(CheckpointError) as loading:
        TrainingState.load(damaged)
    assert str(loading.value) in done.stderr
