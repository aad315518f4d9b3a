"""The C++ header as ONNX Runtime's training header: programs written against ORT's C++ API (the example, the
test programs, one exercising the core classes real applications call) compile and run with this project's
own core classes, and with ONNX Runtime's onnxruntime_cxx_api.h where one is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.native import MLP, PROGRAMS, NativeBuild, build_native
from tests.helpers.paths import EXAMPLES

PROGRAM_SOURCES = [PROGRAMS / "ort_cxx_core.cpp", PROGRAMS / "cxx_api.cpp", EXAMPLES / "native" / "train.cpp"]
ORT_INCLUDE_VARIABLE = "ORT_TORCH_TRAIN_ORT_INCLUDE"


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    return build_native(tmp_path_factory)


def compile_program(native: NativeBuild, source: Path, output: Path, *extra: str) -> subprocess.CompletedProcess:
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    command = [compiler, "-std=c++17", "-O1", "-Wall", "-Werror", *extra, f"-I{PROGRAMS}", *native.flags.cflags]
    command += [str(source), "-o", str(output), *native.flags.libs, "-lpthread", "-lm"]
    return subprocess.run(command, capture_output=True, text=True)


def ort_include_folder() -> Path | None:
    """A folder holding ONNX Runtime's onnxruntime_cxx_api.h: $ORT_TORCH_TRAIN_ORT_INCLUDE, else none."""
    folder = os.environ.get(ORT_INCLUDE_VARIABLE)
    if folder and (Path(folder) / "onnxruntime_cxx_api.h").exists():
        return Path(folder)
    return None


def run_all(native: NativeBuild, folder: Path, *extra: str) -> None:
    for source in PROGRAM_SOURCES:
        program = folder / source.stem
        done = compile_program(native, source, program, *extra)
        assert done.returncode == 0, done.stderr[-4000:]
        out = folder / (source.stem + "_out")
        out.mkdir()
        args = [str(MLP)] if source.stem == "ort_cxx_core" else [str(MLP), str(out)]
        ran = native.run(program, *args)
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
        if source.stem != "train":
            assert ran.stdout.splitlines()[-1] == "ok"


def test_programs_written_against_ort_compile_and_run_with_the_self_contained_header(
    native: NativeBuild, tmp_path: Path
) -> None:
    run_all(native, tmp_path, "-DORT_TORCH_TRAIN_SELF_CONTAINED")
    core = native.run(tmp_path / "ort_cxx_core", str(MLP))
    inference, evaluation = (float(value) for value in core.stdout.split("loss ")[1].split()[:2])
    assert inference == evaluation  # ONNX Runtime's own inference session and the training session's EvalStep


def test_programs_compile_and_run_with_onnxruntimes_own_core_header(native: NativeBuild, tmp_path: Path) -> None:
    folder = ort_include_folder()
    if folder is None:
        pytest.skip(f"no onnxruntime_cxx_api.h: set {ORT_INCLUDE_VARIABLE} to ONNX Runtime's include folder")
    run_all(native, tmp_path, f"-I{folder}")
