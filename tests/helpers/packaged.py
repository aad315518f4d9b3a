"""The runtime with no Python (libort_torch_train_packaged), fixture packages and programs linked against it, each
built once per test run and shared by every module that tests it, in every pytest-xdist worker of the run (see
``tests.helpers.shared_builds``). Skips (cleanly) where no compiler builds it."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from ort_torch_train.cli.main import main
from ort_torch_train.native.build import NativeBuildError, find_compiler
from ort_torch_train.native.packaged_build import PackagedFlags, build_packaged, packaged_flags
from tests.helpers.native import PROGRAMS
from tests.helpers.paths import FIXTURES
from tests.helpers.shared_builds import built_once
from tests.helpers.timeouts import scaled


def packaged_runtime(tmp_path_factory: pytest.TempPathFactory) -> PackagedFlags:
    """The runtime, built (once) under the run's temporary folder."""

    def build(prefix: Path) -> None:
        try:
            build_packaged(prefix)
        except NativeBuildError as error:
            pytest.skip(f"packaged runtime not buildable here: {error}")

    return packaged_flags(built_once(tmp_path_factory, "packaged_prefix", build))


def packaged_program(tmp_path_factory: pytest.TempPathFactory, source: Path) -> Path:
    """``source`` (C or C++) compiled (once) and linked against the runtime, with the test headers' folder."""
    flags = packaged_runtime(tmp_path_factory)
    cxx = source.suffix == ".cpp"

    def build(output: Path) -> None:
        compiler = (shutil.which("c++") or shutil.which("g++")) if cxx else find_compiler()
        if compiler is None:
            pytest.skip("no C++ compiler")
        command = [compiler, "-std=c++17" if cxx else "-std=c11", "-O1", "-Wall", f"-I{PROGRAMS}", *flags.cflags]
        command += [str(source), "-o", str(output), *flags.libs]
        done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(180))
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr}"

    name = f"{source.stem}{'_cpp' if cxx else ''}-{hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]}"
    return built_once(tmp_path_factory, f"packaged_programs/{name}", build)


def fixture_package(tmp_path_factory: pytest.TempPathFactory, case: str) -> Path:
    """The package of the fixture ``case``'s artifacts, built (once) by the command line
    (``ort-torch-train package ARTIFACTS --out DIR``) under the run's temporary folder."""
    if not (FIXTURES / case / "expected.json").is_file():
        pytest.skip(f"fixture {case} not present")

    def build(folder: Path) -> None:
        assert main(["package", str(FIXTURES / case / "artifacts"), "--out", str(folder)]) == 0

    return built_once(tmp_path_factory, f"packages/{case}", build)
