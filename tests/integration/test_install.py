"""The README's install lines, run in a fresh venv that holds only torch (installed as pip leaves it: linked
from this interpreter's install, tests/helpers/e2e_linked_install.py): the built wheel goes in, the installed
torch stays (version and build), torchvision imports or is absent, and the CLI runs; then the README's Quick
start (the Python API), docs/cli.md's worked example (then the page's `inspect` and `--batched` examples and
docs/scaling.md's torchrun line on what it made) run on the installed wheel (they make their own artifacts and
data; every page's examples run on the checkout in test_docs.py). `pip check` says what the README calls
expected."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.e2e_linked_install import link_distributions
from tests.helpers.ports import free_port
from tests.helpers.timeouts import scaled
from tests.unit.cli.test_cli_docs import (
    batched_example,
    inspect_example,
    inspect_output_matches,
    torchrun_example,
    worked_example,
)

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- install: tests/integration/test_install.py"

pytestmark = pytest.mark.slow

_PROBE = """
import json, importlib.util, torch
try:
    import torchvision
    vision = torchvision.__version__
except ModuleNotFoundError:
    vision = None
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "git": torch.version.git_version,
                  "torchvision": vision, "onnx2torch": importlib.util.find_spec("onnx2torch") is not None}))
"""
# the installed onnx2torch imports through the package's own importer (run after the probe, in its process)
_IMPORT_ONNX2TORCH = "from ort_torch_train.onnx2torch_import import import_onnx2torch\nimport_onnx2torch()\n"


def readme_install_lines() -> list[str]:
    """The shell lines of the fenced block that follows the install marker in README.md."""
    text = (ROOT / "README.md").read_text()
    block = re.search(re.escape(MARKER) + r".*?```sh\n(.*?)```", text, re.S)
    assert block, "README.md lost its tested install block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.split("#", 1)[0].strip()]


def _run(command: list[str] | str, env: dict[str, str], **kwargs: object) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return str(done.stdout)


def test_readme_install_keeps_torch_and_runs_cli(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_COMPILE"] = "0"  # no .pyc written by pip (the README's pip commands too): faster, the same packages
    source = tmp_path / "source"  # a clean copy: setuptools leaves build/ in the tree it builds
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("ort_torch_train", "adapters"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheel_command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w"]
    built = subprocess.run([*wheel_command, str(tmp_path), str(source)], env=env, capture_output=True, text=True)
    output = built.stdout + built.stderr
    assert built.returncode == 0 and "_Warning" not in output and "SetuptoolsDeprecationWarning" not in output, output
    (wheel,) = tmp_path.glob("ort_torch_train-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env)
    # pip and torch (its requirements with it) as pip installs them, linked from this interpreter's install
    assert "torch" in link_distributions(venv, ["pip", "torch"])
    bin_dir = venv / "bin"
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    before = json.loads(_run(["python", "-c", _PROBE], env, cwd=tmp_path))

    lines = readme_install_lines()
    assert lines[0].endswith("ort-torch-train"), lines
    lines[0] = lines[0][: -len("ort-torch-train")] + str(wheel)  # the package, from the built wheel
    for line in lines:
        done = subprocess.run(line, env=env, shell=True, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0 and "ERROR" not in done.stdout + done.stderr, f"{line}\n{done.stdout}{done.stderr}"

    after = json.loads(_run(["python", "-c", _PROBE + _IMPORT_ONNX2TORCH], env, cwd=tmp_path))  # one torch import
    assert {k: after[k] for k in ("version", "cuda", "git")} == {k: before[k] for k in ("version", "cuda", "git")}
    assert after["torchvision"] is None or after["torchvision"], after  # importable, or absent
    assert after["onnx2torch"], "onnx2torch was not installed"
    check = subprocess.run(["pip", "check"], env=env, capture_output=True, text=True)
    assert (check.returncode, check.stdout.strip()) == (1, readme_pip_check()), check.stdout + check.stderr
    listed = _run(["pip", "list", "--format=freeze"], env)
    assert "nvidia" not in listed.lower(), listed
    assert "usage" in _run(["ort-torch-train", "--help"], env, cwd=tmp_path).lower()
    quick_start = tmp_path / "quick_start.py"  # the README's Quick start (eager), on the installed wheel
    quick_start.write_text("\n".join(readme_quick_start()) + "\nprint('eval loss', float(eval_loss))\n")
    assert "eval loss" in _run(["python", str(quick_start)], env, cwd=tmp_path)

    _run(["python", "-m", "ort_torch_train.install", "--extra", "data"], env)  # pyarrow, the torch kept
    make_data, commands = worked_example()  # docs/cli.md's: it makes its own artifacts and data
    example = tmp_path / "worked_example"
    example.mkdir()
    _run(["python", "-c", shlex.split(make_data)[2]], env, cwd=example)
    for command in commands:
        _run(shlex.split(command), env, cwd=example)
    assert (example / "run" / "ckpt").is_file() and (example / "run" / "ckpt.best").is_file()
    command, shown = inspect_example()
    assert not inspect_output_matches(shown, _run(command, env, cwd=example))
    assert "trained steps 1-20" in _run(batched_example(), env, cwd=example)
    launch_env = {**env, "PET_MASTER_PORT": str(free_port())}  # torchrun's --master-port, free under xdist
    assert "trained steps 1-10" in _run(torchrun_example(), launch_env, cwd=example, timeout=scaled(180))
    assert (example / "run" / "ddp").is_file()
    after_extra = json.loads(_run(["python", "-c", _PROBE], env, cwd=tmp_path))
    assert after_extra["version"] == before["version"] and after_extra["cuda"] == before["cuda"]


def readme_pip_check() -> str:
    """The `pip check` output that the README's install notes call expected."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"Expected afterwards: `pip check`.*?```text\n(.*?)```", text, re.S)
    assert block, "README.md lost its expected `pip check` output"
    return block.group(1).strip()


def readme_quick_start() -> list[str]:
    """The Quick start's first two python blocks: it makes its own data and artifacts, then trains."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("Faster steps", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "README.md's Quick start changed: update this test"
    return blocks
