"""The C boundary (libort_torch_train): tensors with a NULL or short buffer or in foreign memory, released and
unknown handles, a call in a forked child; each an ORT_INVALID_ARGUMENT (or ORT_FAIL) status naming what is
wrong, the parameters unchanged, the host alive; and the same program under valgrind."""

from __future__ import annotations

import re
import shutil
import site
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.native import MLP, PROGRAMS, NativeBuild, build_native
from tests.helpers.timeouts import scaled

BOUNDARY = PROGRAMS / "boundary.c"
ORT_FORMAT = MLP.parent / "artifacts_ort"

# each entry point that takes or fills a tensor, with a NULL data pointer, a short buffer and foreign memory
TENSOR_CASES = {
    "train_input_null": "inputs[0]: the tensor's data pointer is NULL",
    "train_input_null_labels": "inputs[1]: the tensor's data pointer is NULL",
    "train_input_short": "Got invalid dimensions for input: input",
    "train_input_memory": "inputs[0]: expected a tensor in Cpu or Cuda memory, got DML memory",
    "eval_input_null": "inputs[0]: the tensor's data pointer is NULL",
    "eval_input_short": "Got invalid dimensions for input: input",
    "train_output_null": "outputs[0]: the tensor's data pointer is NULL",
    "eval_output_null": "outputs[0]: the tensor's data pointer is NULL",
    "eval_output_short": "outputs[0]: expected element type 1 and 4 bytes, got element type 1 and 0 bytes",
    "train_output_memory": "outputs[0]: expected a tensor in Cpu or Cuda memory",
    "copy_to_null": "parameters_buffer: the tensor's data pointer is NULL",
    "copy_to_short": "parameters_buffer: expected 837 elements",
    "copy_to_memory": "parameters_buffer: expected a tensor in Cpu or Cuda memory",
    "copy_from_null": "parameters_buffer: the tensor's data pointer is NULL",
    "copy_from_short": "parameters_buffer: Parameters buffer size incorrect. Expected:837, Actual:836",
    "copy_from_memory": "parameters_buffer: expected a tensor in Cpu or Cuda memory",
    "update_null": "parameter: the tensor's data pointer is NULL",
    "update_short": "parameter: Parameter 0.bias: Parameter data shape mismatch",
    "update_memory": "parameter: expected a tensor in Cpu or Cuda memory",
    "get_parameter_null": "allocator: the tensor it allocated is unusable",
}

# each use of a released or never-made handle
HANDLE_CASES = {
    "not_a_session",
    "session_from_released_state",
    "session_size_after_release",
    "session_step_after_release",
    "session_used_after_release",
    "state_used_after_release",
}


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    return build_native(tmp_path_factory)


# a train step in a child made by fork(); a damaged training model from its path and from its bytes
FORK_CASES = {"train_step_in_forked_child"}
BAD_MODEL_CASES = {"bad_model_path", "bad_model_buffer"}
# each damaged model file the run tries (made by the fixture), the status's first words and what it adds
BAD_MODELS = (
    ("truncated.ort", "is a damaged or unreadable ORT-format model (.ort)", "ORT model verification failed."),
    ("noise.onnx", "is not a readable ONNX model", "nor an ORT-format model (.ort FlatBuffers: no ORTM identifier)"),
)


@pytest.fixture(scope="session")
def damaged_models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A truncated ORT-format training model, and a file of random bytes (as BAD_MODELS names them)."""
    folder = tmp_path_factory.mktemp("damaged_models")
    data = (ORT_FORMAT / "training_model.ort").read_bytes()
    (folder / "truncated.ort").write_bytes(data[: len(data) // 2])
    noise = np.random.default_rng(52).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    (folder / "noise.onnx").write_bytes(noise)
    return [folder / name for name, _, _ in BAD_MODELS]


@pytest.fixture(scope="session")
def boundary_run(tmp_path_factory: pytest.TempPathFactory, damaged_models: list[Path]) -> subprocess.CompletedProcess:
    """The boundary program's tensor cases, its handle cases, a call in a forked child (the engine on two threads,
    whose pool the child inherits) and the damaged models, in one run (one library start)."""
    native = build_native(tmp_path_factory)
    arguments = [str(MLP), "tensors,handles,fork,badmodel"]
    for model, (_, first, _) in zip(damaged_models, BAD_MODELS):
        arguments += [str(model), first]
    return native.run(native.program(BOUNDARY), *arguments, threads=2, timeout=scaled(240))


def case_lines(stdout: str) -> list[tuple[str, int, str]]:
    """Each refused call the program printed, in order: (case, status code, message)."""
    found = (line.split(" ", 3) for line in stdout.splitlines() if line.startswith("case "))
    return [(name, int(code), message) for _, name, code, message in found]


def cases(stdout: str) -> dict[str, tuple[int, str]]:
    return {name: (code, message) for name, code, message in case_lines(stdout)}


def test_null_short_and_foreign_tensors_are_refused_at_every_entry_point(
    boundary_run: subprocess.CompletedProcess,
) -> None:
    done = boundary_run
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr  # the program checks the parameters unchanged
    assert done.stdout.splitlines()[-1] == "done"
    assert set(cases(done.stdout)) == set(TENSOR_CASES) | HANDLE_CASES | FORK_CASES | BAD_MODEL_CASES
    found = {name: case for name, case in cases(done.stdout).items() if name in TENSOR_CASES}
    for name, expected in TENSOR_CASES.items():
        assert found[name][0] == 2 and expected in found[name][1], (name, found[name])
    assert "differs run_options_terminate_not_read" in done.stdout  # docs/native.md, "Differences from ONNX Runtime"


def test_released_and_unknown_handles_are_statuses_and_double_release_is_ignored(
    boundary_run: subprocess.CompletedProcess,
) -> None:
    done = boundary_run
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    found = {name: case for name, case in cases(done.stdout).items() if name in HANDLE_CASES}
    assert set(found) == HANDLE_CASES and all(code == 2 for code, _ in found.values())
    assert (
        "sess: expected a live OrtTrainingSession, got one that was released" in found["session_step_after_release"][1]
    )
    assert "checkpoint_state: expected a live OrtCheckpointState" in found["state_used_after_release"][1]
    assert len(re.findall(r"is not a live \w+ \(released twice\?\); ignored", done.stderr)) == 2
    assert "differs state_released_before_session" in done.stdout  # the session keeps its state alive


def test_a_call_in_a_forked_child_is_refused_naming_fork_not_hung(boundary_run: subprocess.CompletedProcess) -> None:
    """The child refuses the step and exits; the parent, which waited for it, trains on (it checks both)."""
    done = boundary_run
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    code, message = cases(done.stdout)["train_step_in_forked_child"]
    assert code == 1 and "fork()" in message


def test_calls_after_the_host_finalized_python_are_refused(native: NativeBuild) -> None:
    """A host that embeds Python, lets the library use its interpreter, then runs Py_FinalizeEx."""
    done = native.run(native.program(BOUNDARY), str(MLP), "finalize", site.getsitepackages()[0])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    found = cases(done.stdout)
    assert set(found) == {"load_after_py_finalize", "state_after_py_finalize"}
    assert all(code == 1 and "Py_Finalize" in message for code, message in found.values())


def test_a_damaged_model_file_is_a_status_naming_it_and_the_formats_tried(
    boundary_run: subprocess.CompletedProcess, damaged_models: list[Path]
) -> None:
    """A truncated ORT-format training model, and a file of random bytes, from a path and from a buffer."""
    done = boundary_run
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    found = [case for case in case_lines(done.stdout) if case[0] in BAD_MODEL_CASES]
    assert [name for name, _, _ in found] == ["bad_model_path", "bad_model_buffer"] * len(BAD_MODELS)
    for index, (model, (_, first, then)) in enumerate(zip(damaged_models, BAD_MODELS)):
        (_, path_code, from_path), (_, buffer_code, from_buffer) = found[2 * index : 2 * index + 2]
        assert path_code == buffer_code == 1  # ORT_FAIL (the program checks the code and the first words)
        assert str(model) in from_path  # the file is named
        assert all(first in message and then in message for message in (from_path, from_buffer))


@pytest.mark.slow
def test_the_boundary_program_is_clean_under_valgrind(native: NativeBuild) -> None:
    """No invalid read or write, in any frame, while the library refuses every bad tensor and handle."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")
    # no allocation or free stacks kept: a report still names every frame of the access; no leak scan at exit
    # (leaks are not what this test looks for, and scanning the interpreter's and torch's heap is slow)
    command = ["valgrind", "--error-limit=no", "--undef-value-errors=no", "--leak-check=no"]
    command += ["--num-callers=30", "--keep-stacktraces=none"]
    done = subprocess.run(
        [*command, str(native.program(BOUNDARY)), str(MLP), "tensors,handles"],
        capture_output=True,
        text=True,
        timeout=scaled(1800),
        env=native.environment(threads=1, env={"PYTHONMALLOC": "malloc"}),
    )
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "done", done.stdout[-2000:] + done.stderr[-4000:]
    assert set(cases(done.stdout)) == set(TENSOR_CASES) | HANDLE_CASES
    assert re.search(r"ERROR SUMMARY: \d+ errors", done.stderr)
    assert invalid_accesses(done.stderr) == [], done.stderr[-6000:]


def invalid_accesses(log: str) -> list[str]:
    """valgrind's invalid reads, writes and frees, less the dynamic loader's word-wise string reads (a known
    false report: ld.so's strncmp reads whole words past a string's end, inside the allocation's alignment)."""
    records = re.split(r"^==\d+== $", log, flags=re.MULTILINE)
    invalid = [record.strip() for record in records if re.search(r"Invalid (?:read|write|free)", record)]
    return [record for record in invalid if not re.search(r"\(dl-(?:load|open|deps)\.c:\d+\)", record)]
