"""README.md and the docs pages pasted the way a reader would: every page's ```python blocks, in the
site's order (mkdocs.yml's nav), each page in a fresh interpreter, all in ONE folder that starts empty;
the training-loop page twice. No setup is hidden from the reader, and no page overwrites what a later
page relies on (the README's artifacts, which docs/native.md's C example trains)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import doc_snippets
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled


def reading_order() -> list[Path]:
    """README.md, then the site's pages in nav order."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [ROOT / "README.md", *(ROOT / "docs" / next(iter(entry.values())) for entry in nav)]


def test_no_page_hides_its_setup() -> None:
    assert sorted(doc_snippets.pages()) == sorted(reading_order()), "a page is missing from mkdocs.yml's nav"
    hidden = [str(page.relative_to(ROOT)) for page in reading_order() if "<!-- snippet: setup" in page.read_text()]
    assert hidden == [], "setup must be shown (a collapsed ??? admonition is fine)"


def test_setup_in_a_collapsed_admonition_is_read_as_a_block() -> None:
    text = '??? example "Setup: x"\n\n    ```python\n    x = 1\n\n    y = x\n    ```\n\n```python\nz = y\n```\n'
    blocks = doc_snippets.parse_blocks(ROOT / "docs" / "index.md", text)
    assert [(block.line, block.code) for block in blocks] == [(4, "x = 1\n\ny = x\n"), (10, "z = y\n")]


def digest(folder: Path) -> dict[str, str]:
    """The files of ``folder`` and their SHA-256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.slow
@pytest.mark.compile  # the README's and scaling.md's compiled steps
def test_pages_pasted_in_order_into_one_empty_folder(tmp_path: Path) -> None:
    """The pages' programs compile into the suite's inductor cache (outside the reader's folder), as a
    reader's programs use the default one."""
    folder = tmp_path / "reader"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"}
    pages = reading_order()
    loop = ROOT / "docs" / "training-loop.md"
    readme_artifacts: dict[str, str] | None = None
    for page in [*pages, loop]:  # the training-loop example run a second time in the same folder
        blocks = doc_snippets.page_blocks(page)
        if not any(block.skip_reason is None for block in blocks):
            continue
        result = subprocess.run(
            [sys.executable, "-c", doc_snippets.RUNNER],
            input=json.dumps(doc_snippets.program(blocks)),
            capture_output=True,
            text=True,
            timeout=scaled(600),
            cwd=folder,
            env=env,
        )
        name = page.relative_to(ROOT)
        assert result.returncode == 0, f"{name}, pasted after the pages before it:\n{result.stderr[-4000:]}"
        if page.name == "README.md":
            readme_artifacts = digest(folder / "artifacts")
    assert readme_artifacts is not None and "checkpoint" in readme_artifacts
    assert digest(folder / "artifacts") == readme_artifacts, "a page overwrote the README's artifacts/"


REFERENCE_EXAMPLES = [
    "ort_torch_train.api:CheckpointState",
    "ort_torch_train.api:Module",
    "ort_torch_train.api:Optimizer",
    "ort_torch_train.api:LinearLRScheduler",
    "ort_torch_train.api:CosineLRScheduler",
    "ort_torch_train.api:ConstantWithWarmupLRScheduler",
    "ort_torch_train.trainer:fit",
    "ort_torch_train.trainer:print",
    "ort_torch_train.trainer:TorchMetric",
    "ort_torch_train.lora:LoraConfig",
    "ort_torch_train.session:TrainingSession",
]

RUN_EXAMPLES = """
import importlib, inspect, re, sys, textwrap
for target in sys.argv[1:]:
    module_name, name = target.split(":")
    doc = inspect.getdoc(getattr(importlib.import_module(module_name), name))
    (code,) = re.findall(r"^Examples?:\\n((?:    .*\\n|\\n)+)", doc + "\\n", re.M)
    code = textwrap.dedent(code).strip()
    assert code.startswith("```python") and code.endswith("```"), target
    exec(compile(code[len("```python"):-3], f"{target} (Examples)", "exec"), {"__name__": "__main__"})
    print("ran", target, flush=True)
"""


@pytest.mark.slow
def test_api_reference_examples_run_on_the_readme_artifacts(tmp_path: Path) -> None:
    """Every public class page's Examples section (the docstrings mkdocstrings renders) runs, pasted into
    the folder where the README's Quick start made its artifacts."""
    quick_start = doc_snippets.page_blocks(ROOT / "README.md")[0]
    assert "generate_artifacts(" in quick_start.code
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", quick_start.code], cwd=tmp_path, env=env, check=True, timeout=scaled(300))
    pytest.importorskip("torchmetrics")
    result = subprocess.run(
        [sys.executable, "-c", RUN_EXAMPLES, *REFERENCE_EXAMPLES],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(600),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert result.stdout.count("ran ") == len(REFERENCE_EXAMPLES), result.stdout
