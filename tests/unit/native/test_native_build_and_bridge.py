"""The native package's Python side: the build command's pieces, and how the bridge maps errors and options."""

from __future__ import annotations

import pytest

from ort_torch_train.errors import CheckpointError, InputError, ModelError, UnsupportedOperatorError
from ort_torch_train.native import NativeBuildError, packaged_build
from ort_torch_train.native.bridge import (
    ORT_FAIL,
    ORT_INVALID_ARGUMENT,
    ORT_NO_SUCHFILE,
    ORT_NOT_IMPLEMENTED,
    ORT_RUNTIME_EXCEPTION,
    compile_setting,
    error_status,
    tensor_in,
    tensor_out,
)
from ort_torch_train.native.build import SANITIZE, SOURCES, compile_command, find_compiler, flags


def test_no_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(NativeBuildError, match="no C compiler found"):
        find_compiler()


def test_compile_command_uses_sysconfig_and_every_source(tmp_path) -> None:
    command = compile_command(tmp_path, "cc", tmp_path / "lib" / "libort_torch_train.so")
    assert all(str(source) in command for source in SOURCES.glob("*.c"))
    assert any(part.startswith("-DOTT_PYTHON_EXECUTABLE=") for part in command)
    assert "-l:libonnxruntime.so.1" in command and "-fvisibility=hidden" in command
    assert flags(tmp_path).libs[-2:] == ["-lort_torch_train", "-l:libonnxruntime.so.1"]


def test_sanitize_adds_the_sanitizer_flags_to_both_builds_only_when_asked(tmp_path) -> None:
    library = tmp_path / "lib" / "libort_torch_train.so"
    assert not set(SANITIZE) & set(compile_command(tmp_path, "cc", library))
    assert set(SANITIZE) <= set(compile_command(tmp_path, "cc", library, sanitize=True))
    runtime = tmp_path / "lib" / packaged_build.LIBRARY
    assert not set(SANITIZE) & set(packaged_build.compile_command(runtime, "c++"))
    assert set(SANITIZE) <= set(packaged_build.compile_command(runtime, "c++", sanitize=True))


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InputError("input 'x': bad rank"), ORT_INVALID_ARGUMENT),
        (KeyError("Parameter w not found."), ORT_INVALID_ARGUMENT),
        (FileNotFoundError("no such file"), ORT_NO_SUCHFILE),
        (CheckpointError("Checkpoint verification failed."), ORT_FAIL),
        (ModelError("Eval model was not provided."), ORT_FAIL),
        (UnsupportedOperatorError("no converter for Foo"), ORT_NOT_IMPLEMENTED),
        (ZeroDivisionError("division by zero"), ORT_RUNTIME_EXCEPTION),
    ],
)
def test_errors_map_to_ort_codes_with_one_line_messages(error: BaseException, code: int) -> None:
    got, message = error_status(error)
    assert got == code and message and "\n" not in message
    if isinstance(error, KeyError):
        assert message == "Parameter w not found."  # not repr'd with quotes
    if code == ORT_RUNTIME_EXCEPTION:
        assert message.startswith("ZeroDivisionError: ")


@pytest.mark.parametrize(
    ("text", "setting"), [("", False), ("0", False), ("1", True), ("true", True), ("max-autotune", "max-autotune")]
)
def test_compile_option_text(text: str, setting: bool | str) -> None:
    assert compile_setting(text) == setting


def test_tensors_are_wrapped_without_copy_and_handed_back() -> None:
    memory = bytearray(24)
    tensor = tensor_in((memoryview(memory), 1, (2, 3), "cpu"), "x")
    tensor[1, 2] = 5.0
    assert memory[20:24] == bytes.fromhex("0000a040")  # 5.0f, little-endian, written through
    host, address, nbytes, elem_type, shape = tensor_out(tensor)
    assert (address, nbytes, elem_type, shape) == (tensor.data_ptr(), 24, 1, (2, 3))
    with pytest.raises(TypeError, match="element type STRING"):
        tensor_in((memoryview(memory), 8, (3,), "cpu"), "x")
