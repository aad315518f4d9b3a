"""The documentation builds without a warning (mkdocs --strict; a broken reference or link fails) and every public
name has a docstring."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

PUBLIC_MODULES = [
    "ort_torch_train.api",
    "ort_torch_train.artifacts",
    "ort_torch_train.session",
    "ort_torch_train.errors",
    "ort_torch_train.logs",
    "ort_torch_train.legacy",
]


def public_names_without_docstring() -> list[str]:
    """Public classes and functions of the public modules, and their public methods and properties
    (inherited ones from this package included), that have no docstring."""
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", [name for name in vars(module) if not name.startswith("_")])
        for name in names:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not obj.__module__.startswith(
                "ort_torch_train"
            ):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{module_name}.{name}")
            if inspect.isclass(obj):
                owners = [c for c in obj.__mro__ if c.__module__.startswith("ort_torch_train")]
                members = {m: attr for owner in reversed(owners) for m, attr in vars(owner).items()}
                for member, attr in members.items():
                    function = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
                    if not member.startswith("_") and inspect.isfunction(function) and not function.__doc__:
                        missing.append(f"{module_name}.{name}.{member}")
    return sorted(set(missing))


def test_every_public_name_has_a_docstring() -> None:
    assert public_names_without_docstring() == []


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocstrings") is None, reason="the docs extra is not installed")
def test_documentation_builds_without_warnings(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or output[-3000:]
    page = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("CheckpointState", "lazy_reset_grad", "generate_artifacts", "TrainingSession", "ModelError"):
        assert name in page


def quick_start_blocks() -> list[str]:
    """The README's Quick start Python blocks: generating artifacts, then ORT's loop on them."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


@pytest.mark.slow
def test_readme_quick_start_runs(tmp_path: Path) -> None:
    """The first two blocks fit together: the artifacts they make train, and the inference model they
    export has the output the export names (the later blocks need a compiler or a GPU)."""
    generate, train = quick_start_blocks()[:2]
    check = (
        "import onnx\n"
        "assert [o.name for o in onnx.load('inference.onnx').graph.output] == ['logits']\n"
        "assert float(eval_loss) < 1.0, eval_loss\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", generate + train + check],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"} <= {
        path.name for path in (tmp_path / "artifacts").iterdir()
    }
