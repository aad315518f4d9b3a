"""The C and C++ training API (libort_torch_train): every OrtTrainingApi function from a C program, errors
as statuses, the OrtApi positions, the transparent path, C++, threads, memory and the examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ort_torch_train.cli.main import main
from tests.helpers.native import MLP, PROGRAMS, NativeBuild, build_native
from tests.helpers.paths import EXAMPLES, ROOT

HEADER = ROOT / "ort_torch_train" / "native" / "include" / "ort_torch_train_training_c_api.h"


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    return build_native(tmp_path_factory)


def training_api_members() -> list[str]:
    """The OrtTrainingApi members, in the header's order."""
    struct = HEADER.read_text().split("struct OrtTrainingApi {", 1)[1].split("};", 1)[0]
    return re.findall(r"\(\*(\w+)\)\(", struct)


def test_the_table_has_the_seed_headers_members_in_order() -> None:
    seed = ROOT.parent / "shared" / "seeds" / "c_training_api_header.txt"
    members = training_api_members()
    assert len(members) == 33 and members[0] == "LoadCheckpoint" and members[-1] == "GetParameter"
    if seed.exists():
        declared = re.findall(r"ORT_API2_STATUS\((\w+)|ORT_CLASS_RELEASE\((\w+)\)", seed.read_text())
        assert members == [status or f"Release{release}" for status, release in declared]


def test_ort_abi_positions_match_the_installed_onnxruntime(native: NativeBuild) -> None:
    done = native.run(native.program(PROGRAMS / "abi_check.c", transparent=True))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok" and "Cuda" in done.stdout


def test_every_function_and_every_error_case(native: NativeBuild, tmp_path: Path) -> None:
    done = native.run(native.program(PROGRAMS / "api_coverage.c"), str(MLP), str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    called = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("called ")}
    assert called == set(training_api_members())
    cases = {line.split()[1]: line.split(" ", 3)[2:] for line in done.stdout.splitlines() if line.startswith("case ")}
    assert cases["wrong_dtype"] == ["2", cases["wrong_dtype"][1]] and "tensor(double)" in cases["wrong_dtype"][1]
    assert "rank" in cases["wrong_rank"][1] and "2 user inputs" in cases["wrong_count"][1]
    assert cases["missing_eval_model"][0] == "1" and "Eval model was not provided" in cases["missing_eval_model"][1]
    assert (
        cases["corrupted_checkpoint"][0] == "1" and "Checkpoint verification failed" in cases["corrupted_checkpoint"][1]
    )
    assert cases["missing_checkpoint"][0] == "3"
    assert cases["input_name_index_max"][0] == "2" and str(2**64 - 1) in cases["input_name_index_max"][1]
    assert "-1" not in cases["input_name_index_max"][1]
    not_utf8 = cases["export_output_not_utf8"]
    assert not_utf8[0] == "2" and "graph_output_names[0]: expected a UTF-8 name" in not_utf8[1], not_utf8
    over = cases["buffer_num_bytes_over_ssize"]
    assert over[0] == "2" and f"num_bytes: {2**63} is larger than any buffer" in over[1], over
    nulls = [case for name, case in cases.items() if name.startswith("null_")]
    assert len(nulls) == 42 and all(code == "2" and "got NULL" in message for code, message in nulls)
    assert "Traceback" not in done.stderr  # errors are statuses, never printed tracebacks


def test_transparent_path_trains_an_unmodified_program_when_preloaded(native: NativeBuild) -> None:
    program = native.program(PROGRAMS / "transparent.c", transparent=True)
    alone = native.run(program, str(MLP))
    assert alone.returncode == 3 and "GetTrainingApi answered NULL" in alone.stdout
    preloaded = native.run(program, str(MLP), preload=True)
    assert preloaded.returncode == 0, preloaded.stdout + preloaded.stderr
    losses = [float(line.split()[2]) for line in preloaded.stdout.splitlines() if line.startswith("loss ")]
    assert len(losses) == 5 and losses[-1] < losses[0]
    # the CUDA execution provider appended through ORT's table is recorded as the training device
    cuda = native.run(program, str(MLP), "cuda", preload=True)
    assert "device cuda:0" in cuda.stdout
    import torch

    if not torch.cuda.is_available():
        assert cuda.returncode == 2 and "error CreateTrainingSession 11" in cuda.stdout
        assert "Traceback" not in cuda.stderr  # a status, not a printed traceback...
        logged = native.run(program, str(MLP), "cuda", preload=True, env={"ORT_TORCH_TRAIN_LOG": "debug"})
        assert "Traceback" in logged.stderr and "native call failed" in logged.stderr  # ...unless logging asks


def test_two_sessions_on_two_threads_match_serial_runs(native: NativeBuild) -> None:
    """At a fixed thread count (the run's ORT_TORCH_TRAIN_THREADS=1), which the library logs at its first
    session (ORT_TORCH_TRAIN_LOG=info): under auto the count would follow the load."""
    program = native.program(PROGRAMS / "threads_rss.c")
    done = native.run(program, str(MLP), "threads", "20", threads=1, env={"ORT_TORCH_TRAIN_LOG": "info"})
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stdout + done.stderr
    policy = [line for line in done.stderr.splitlines() if "threads: " in line]
    assert len(policy) == 1 and policy[0].endswith(
        "threads: 1, fixed: CPU steps repeat bit for bit ($ORT_TORCH_TRAIN_THREADS=1)"
    ), done.stderr


def test_rss_stays_flat_over_2000_steps(native: NativeBuild) -> None:
    done = native.run(native.program(PROGRAMS / "threads_rss.c"), str(MLP), "rss", "2000")
    assert done.returncode == 0, done.stderr
    rss = [int(line.split()[2]) for line in done.stdout.splitlines() if line.startswith("rss ")]
    assert len(rss) == 10
    # after the first 200 steps (allocator warm-up), 1,800 more grow the resident set by under 2 MiB
    assert rss[-1] - rss[0] < 2048, rss


def test_c_and_cpp_examples_train_export_infer_in_onnxruntime_and_agree(native: NativeBuild, tmp_path: Path) -> None:
    outputs = []
    for source in ("train.c", "train.cpp"):
        out = tmp_path / source
        out.mkdir()
        done = native.run(native.program(EXAMPLES / "native" / source), str(MLP), str(out))
        assert done.returncode == 0, done.stdout + done.stderr
        losses = [float(line.split()[2]) for line in done.stdout.splitlines() if line.startswith("loss ")]
        accuracy = float(done.stdout.split("accuracy ")[1].split()[0])
        assert losses[-1] < losses[0] / 3 and accuracy >= 0.8
        assert (out / "checkpoint").stat().st_size > 0 and (out / "inference.onnx").stat().st_size > 0
        outputs.append([line for line in done.stdout.splitlines() if line.startswith(("loss", "eval", "accuracy"))])
    assert outputs[0] == outputs[1]


def test_c_and_cpp_examples_run_on_the_readme_artifacts(native: NativeBuild, tmp_path: Path) -> None:
    """On the README Quick start's artifacts (input `features`, not the fixture's `input`), both examples
    feed the inference model under the name the artifacts give."""
    import torch

    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

    torch.manual_seed(0)
    generate_artifacts(
        torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)),
        example_inputs=(torch.zeros(64, 20),),
        input_names=["features"],
        output_names=["logits"],
        dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}},
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "artifacts",
    )
    for source in ("train.c", "train.cpp"):
        out = tmp_path / source
        out.mkdir()
        done = native.run(native.program(EXAMPLES / "native" / source), str(tmp_path / "artifacts"), str(out))
        assert done.returncode == 0, done.stdout + done.stderr
        assert float(done.stdout.split("accuracy ")[1].split()[0]) >= 0.8, done.stdout


def test_flags_command_prints_what_programs_compile_with(native: NativeBuild, capsys: pytest.CaptureFixture) -> None:
    assert main(["native", "flags", "--prefix", str(native.flags.prefix)]) == 0
    printed = capsys.readouterr().out.split()
    assert f"-I{native.flags.prefix / 'include'}" in printed and "-lort_torch_train" in printed
    assert main(["native", "flags", "--prefix", str(native.flags.prefix / "nowhere")]) == 1


def test_a_program_that_embeds_python_keeps_its_interpreter(native: NativeBuild, tmp_path: Path) -> None:
    """Loaded into this (Python) process, the library uses the running interpreter and its GIL."""
    import ctypes

    library = ctypes.CDLL(str(native.flags.library))
    library.OrtTorchTrainGetTrainingApi.restype = ctypes.POINTER(ctypes.c_void_p)
    table = library.OrtTorchTrainGetTrainingApi(23)
    members = training_api_members()
    load = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p))(
        table[members.index("LoadCheckpoint")]
    )
    save = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_bool)(
        table[members.index("SaveCheckpoint")]
    )
    release = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(table[members.index("ReleaseCheckpointState")])
    state = ctypes.c_void_p()
    assert load(str(MLP / "checkpoint").encode(), ctypes.byref(state)) is None
    assert save(state, str(tmp_path / "saved").encode(), False) is None
    release(state)
    reference = tmp_path / "reference"
    from ort_torch_train.api import CheckpointState

    CheckpointState.save_checkpoint(CheckpointState.load_checkpoint(MLP / "checkpoint"), reference, False)
    assert (tmp_path / "saved").read_bytes() == reference.read_bytes()


def test_cpp_classes_buffers_properties_parameters_and_exceptions(native: NativeBuild, tmp_path: Path) -> None:
    done = native.run(native.program(PROGRAMS / "cxx_api.cpp"), str(MLP), str(tmp_path))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
