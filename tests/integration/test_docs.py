"""The documentation builds without a warning (mkdocs --strict; a broken reference or link fails), every public
name has a docstring, and every ```python block of docs/*.md runs (tests/helpers/doc_snippets.py); README.md's
run in test_docs_pasted.py, first, in an empty folder."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import doc_reference, doc_snippets
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

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
        timeout=scaled(120),
        cwd=ROOT,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or output[-3000:]
    page = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("CheckpointState", "lazy_reset_grad", "generate_artifacts", "TrainingSession", "ModelError"):
        assert name in page
    check_reference(tmp_path / "site", page)


def check_reference(site: Path, page: str) -> None:
    """Search, Module's parameters with their types, every constructor documented, helpers hidden,
    nothing loaded from another site (tests/helpers/doc_reference.py)."""
    search = json.loads((site / "search" / "search_index.json").read_text())["docs"]
    assert any(entry["title"] == "CheckpointState" for entry in search)
    titles = [entry["title"] for entry in search if entry["location"].startswith("api/#")]
    assert "Module.lazy_reset_grad" in titles and "TrainingSession.lazy_reset_grad" in titles
    assert sorted({t for t in titles if titles.count(t) > 1}) == [], "search titles that cannot be told apart"
    assert "train_and_update" not in page  # an internal hook of the Optimizer
    sections = doc_reference.class_sections(page)
    for name in (
        "api.Module",
        "api.Optimizer",
        "api.CheckpointState",
        "api.LinearLRScheduler",
        "api.CosineLRScheduler",
    ):
        assert "Examples:" in sections[f"ort_torch_train.{name}"], name
    assert 'src="../search/main.js"' in page
    assert not re.findall(r'<script[^>]+src="https?:|<link[^>]+href="https?:[^"]+\.(?:css|js)"', page)
    module = doc_reference.documented_parameters(doc_reference.class_sections(page)["ort_torch_train.api.Module"])
    assert module["compile"] == "bool | str | dict" and module["lora"] == "LoraConfig | None", module
    assert {"device", "mixed_precision", "recompute", "distributed", "compile_cache"} <= set(module)
    assert doc_reference.undocumented_constructors(page) == []
    for helper in ("model_inputs", "deferred_interrupt", "loss_value"):
        assert helper not in page, helper
    without_table = page.replace("Parameters:", "Notes:", 1)  # the first class (CheckpointState) loses its table
    assert doc_reference.undocumented_constructors(without_table)[0].startswith("ort_torch_train.api.CheckpointState")


def snippet_pages() -> list:
    """Every page with Python blocks but README.md, marked ``compile`` where a block it runs compiles.
    README.md's program runs first, in an empty folder, in test_docs_pasted.py: the same run."""
    params = []
    for page in doc_snippets.pages():
        if page == ROOT / "README.md":
            continue
        blocks = doc_snippets.page_blocks(page)
        if blocks:
            compiles = any("compile=" in code for _, code in doc_snippets.program(blocks))
            marks = [pytest.mark.compile] if compiles else []
            params.append(pytest.param(page, marks=marks, id=str(page.relative_to(ROOT))))
    return params


@pytest.mark.slow
@pytest.mark.parametrize("page", snippet_pages())
def test_page_snippets_run_chained(page: Path, tmp_path: Path) -> None:
    """Every ```python block of the page runs, the page's blocks as one program in order, in an empty
    directory; blocks marked ``<!-- snippet: skip (reason) -->`` are left out (tests/helpers/doc_snippets.py).
    The pages compile into the suite's inductor cache, as a reader's programs use the default one."""
    blocks = doc_snippets.page_blocks(page)
    result = subprocess.run(
        [sys.executable, "-c", doc_snippets.RUNNER],
        input=json.dumps(doc_snippets.program(blocks)),
        capture_output=True,
        text=True,
        timeout=scaled(600),
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-4000:] or result.stdout[-4000:]


def test_every_skipped_block_says_why() -> None:
    blocks = [(page, block) for page in doc_snippets.pages() for block in doc_snippets.page_blocks(page)]
    unexplained = [
        f"{page.name}:{block.line}"
        for page, block in blocks
        if block.skip_reason is not None and not block.skip_reason.strip()
    ]
    assert unexplained == [], "a skip marker without a reason"


def test_snippet_markers_are_read() -> None:
    """The skip marker applies to the block right after it only; hidden code runs in page order."""
    page = ROOT / "docs" / "index.md"
    text = (
        "<!-- snippet: setup\nx = 1\n-->\n\n<!-- snippet: skip (needs a GPU) -->\n\n```python\ny = x\n```\n"
        "```python\nz = x\n```\n<!-- snippet: check\nassert z == 1\n-->\n"
    )
    blocks = doc_snippets.parse_blocks(page, text)
    assert [(b.line, b.hidden, b.skip_reason, b.code) for b in blocks] == [
        (2, True, None, "x = 1\n"),
        (8, False, "needs a GPU", "y = x\n"),
        (11, False, None, "z = x\n"),
        (14, True, None, "assert z == 1\n"),
    ]
    namespace: dict = {}
    for filename, code in doc_snippets.program(blocks):
        exec(compile(code, filename, "exec"), namespace)
    assert namespace["z"] == 1 and "y" not in namespace
