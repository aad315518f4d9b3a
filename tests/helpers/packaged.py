"""The runtime with no Python (libort_torch_train_packaged), fixture packages and programs linked against it, each
built once per test session and shared by the modules that test it. Skips (cleanly) where no compiler builds it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ort_torch_train.native.build import NativeBuildError, find_compiler
from ort_torch_train.native.packaged_build import PackagedFlags, build_packaged
from ort_torch_train.training.package.build import build_package
from tests.helpers.native import PROGRAMS
from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled

_BUILT: dict[str, object] = {}


def packaged_runtime(tmp_path_factory: pytest.TempPathFactory) -> PackagedFlags:
    """The runtime, built (once) under the session's temporary folder."""
    if "runtime" not in _BUILT:
        try:
            _BUILT["runtime"] = build_packaged(tmp_path_factory.getbasetemp() / "packaged_prefix")
        except NativeBuildError as error:
            pytest.skip(f"packaged runtime not buildable here: {error}")
    flags = _BUILT["runtime"]
    assert isinstance(flags, PackagedFlags)
    return flags


def packaged_program(tmp_path_factory: pytest.TempPathFactory, source: Path) -> Path:
    """``source`` (C or C++) compiled (once) and linked against the runtime, with the test headers' folder."""
    key = f"program:{source}"
    if key not in _BUILT:
        flags = packaged_runtime(tmp_path_factory)
        cxx = source.suffix == ".cpp"
        compiler = (shutil.which("c++") or shutil.which("g++")) if cxx else find_compiler()
        if compiler is None:
            pytest.skip("no C++ compiler")
        output = flags.prefix / "bin" / f"{source.stem}{'_cpp' if cxx else ''}"
        output.parent.mkdir(exist_ok=True)
        command = [compiler, "-std=c++17" if cxx else "-std=c11", "-O1", "-Wall", f"-I{PROGRAMS}", *flags.cflags]
        command += [str(source), "-o", str(output), *flags.libs]
        done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(180))
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr}"
        _BUILT[key] = output
    program = _BUILT[key]
    assert isinstance(program, Path)
    return program


def fixture_package(tmp_path_factory: pytest.TempPathFactory, case: str) -> Path:
    """The package of the fixture ``case``'s artifacts, built (once) under the session's temporary folder."""
    key = f"package:{case}"
    if key not in _BUILT:
        if not (FIXTURES / case / "expected.json").is_file():
            pytest.skip(f"fixture {case} not present")
        folder = tmp_path_factory.mktemp("package") / case
        build_package(FIXTURES / case / "artifacts", folder)
        _BUILT[key] = folder
    package = _BUILT[key]
    assert isinstance(package, Path)
    return package
