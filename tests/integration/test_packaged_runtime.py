"""The runtime with no Python (issue 51, item 2): a C program written against ONNX Runtime's training C API, linked
against libort_torch_train_packaged (libtorch only), trains a package in a process where no libpython is mapped,
and gives what the Python API gives: losses, eval loss and parameters to 1e-6 of the eager run, and the checkpoint
byte for byte as the Python run through the same package writes it. Every bad call it tries is a status."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.cli.main import main
from ort_torch_train.native.packaged_build import packaged_flags
from ort_torch_train.state.training_state import TrainingState
from tests.helpers.fixture_runs import fixture_batches, python_run, write_raw_inputs
from tests.helpers.native import MLP, PROGRAMS
from tests.helpers.ort_peer import ORT_PYTHON, run_ort
from tests.helpers.packaged import fixture_package, packaged_program, packaged_runtime
from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled

CASE = "mlp_ce_adamw_sched"
# the fixtures trained, and the tolerance of their parameters against the eager run's: BatchNorm cancels the gradient
# of the bias before it, and AdamW turns its rounding noise into lr-sized steps (as for compiled steps: test_compile.py)
CASES = {CASE: 1e-6, "bn_frozen_stats": 1e-4}
STEPS = 6
ACCUMULATED = 1  # the step after which neither the optimizer steps nor the gradients reset
pytestmark = [pytest.mark.compile, pytest.mark.slow]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The runtime's install folder and the C program linked against it, built once for the test run."""
    flags = packaged_runtime(tmp_path_factory)
    return flags.prefix, packaged_program(tmp_path_factory, PROGRAMS / "packaged_runtime.c")


def _package(case: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's package, built once for the test run."""
    return fixture_package(tmp_path_factory, case)


def _export_outputs(package: Path) -> list[str]:
    """The outputs of the package's first prepared export (the eval model's outputs before its loss)."""
    lines = (package / "native_steps.txt").read_text().splitlines()
    return [line.split()[2] for line in lines if line.startswith("export_output 0 ")]


def _python_run(
    case: str, compile: bool | str, export: tuple[Path, list[str]] | None = None
) -> tuple[np.ndarray, float, np.ndarray, bytes]:
    """What packaged_runtime.c does, through the Python API (exporting ``export``'s outputs to its path)."""
    run = python_run(case, STEPS, compile, (2, STEPS + 1), ACCUMULATED)
    params = run.module.contiguous_parameters(False).detach().numpy().copy()
    if export is not None:
        run.module.export_model_for_inferencing(export[0], export[1])
    state = run.module.training_state
    return run.losses, float(run.eval_loss.reshape(-1)[0]), params, bytes(state.to_bytes(include_optimizer_state=True))


def _run_c(program: Path, package: Path, case: str, folder: Path) -> subprocess.CompletedProcess:
    """packaged_runtime.c's run, which writes nothing but its outputs: no temporary folder, even where it ends at an
    error without releasing the session (libtorch's loader unpacks a program archive into one, left behind then)."""
    data, out, scratch = folder / "data", folder / "out", folder / "tmp"
    write_raw_inputs(case, data, STEPS)
    out.mkdir()
    scratch.mkdir()
    checkpoint = FIXTURES / case / "artifacts" / "checkpoint"
    arguments = [str(package), str(checkpoint), str(data), str(out), str(STEPS), str(ACCUMULATED), "0.weight"]
    arguments.append(",".join(_export_outputs(package)))
    environment = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run(
        [str(program), *arguments], capture_output=True, text=True, env=environment, timeout=scaled(300)
    )
    assert not any(scratch.iterdir()), sorted(scratch.iterdir())
    return done


@pytest.fixture(scope="module", params=list(CASES))
def c_run(
    request: pytest.FixtureRequest, built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    """The C program's run on a fixture: (the fixture, its package, the output folder: losses.bin, eval.bin,
    params.bin, checkpoint)."""
    case: str = request.param
    package = _package(case, tmp_path_factory)
    root = tmp_path_factory.mktemp("c_run")
    done = _run_c(built[1], package, case, root)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((package / "manifest.json").read_text())
    train = [entry["name"] for entry in manifest["train"]["inputs"]], manifest["train"]["outputs"]
    evaluation = [entry["name"] for entry in manifest["eval"]["inputs"]], manifest["eval"]["outputs"]
    names = " | ".join(" ".join(group) for group in (*train, *evaluation))
    shape = next(entry["shape"] for entry in manifest["trainable"] if entry["name"] == "0.weight")
    assert done.stdout.splitlines() == [
        "libpython mapped: 0",
        f"names: {names}",
        "0.weight: " + " ".join(map(str, shape)),
        "boundary: ok",
        "done",
    ]
    return case, package, root / "out"


def test_c_program_trains_a_package_with_no_python_as_python_does(c_run: tuple[str, Path, Path]) -> None:
    case, package, out = c_run
    eager, packaged = _python_run(case, False), _python_run(case, f"package:{package}")
    losses = np.fromfile(out / "losses.bin", dtype=np.float32)
    np.testing.assert_allclose(losses, eager[0], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(losses, np.float32(packaged[0]))  # the same train program: the same bits
    # the first step's output, held by the program through every later step, is the caller's: unchanged
    assert losses[0] != losses[-1]
    np.testing.assert_array_equal(np.fromfile(out / "first_loss_held.bin", dtype=np.float32), losses[:1])
    tolerance = CASES[case]
    assert float(np.fromfile(out / "eval.bin", dtype=np.float32)[0]) == pytest.approx(eager[1], abs=tolerance)
    np.testing.assert_allclose(np.fromfile(out / "params.bin", dtype=np.float32), eager[2], rtol=0, atol=tolerance)
    written = (out / "checkpoint").read_bytes()
    saved, reference = TrainingState.load(written), TrainingState.load(eager[3])
    # the bytes are those the Python engine writes for the same state; the Python runs' own states differ from
    # it in the last bit of some values (their optimizer runs the eager kernel, the runtime the package's program)
    assert bytes(saved.to_bytes(include_optimizer_state=True)) == written
    assert saved.properties == {"epoch": 3, "note": "packaged"}  # AddProperty's, saved
    assert saved.optimizer is not None and reference.optimizer is not None
    assert (saved.optimizer.step, saved.optimizer.initial_learning_rate) == (
        reference.optimizer.step,
        reference.optimizer.initial_learning_rate,
    )
    assert saved.optimizer.step == STEPS - 1
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(
            saved.state_dict()[name].numpy(), value.numpy(), rtol=0, atol=tolerance, err_msg=name
        )
    for name, moments in reference.optimizer.momentums.items():
        for moment, value in moments.items():
            held = saved.optimizer.momentums[name][moment].numpy()
            np.testing.assert_allclose(held, value.numpy(), rtol=0, atol=tolerance, err_msg=f"{name} {moment}")


def test_the_runtime_exports_the_model_the_python_engine_exports(c_run: tuple[str, Path, Path], tmp_path: Path) -> None:
    """ExportModelForInferencing with no Python: the package's prepared model with the trained values spliced in
    is the Python engine's export after the same training (its graph, outputs, and values to the runs' tolerance),
    and onnxruntime runs both to the same outputs."""
    import onnx
    import onnxruntime

    case, package, out = c_run
    names = _export_outputs(package)
    assert names, "the package prepared no export"
    _python_run(case, False, (tmp_path / "python.onnx", names))
    runtime, python = onnx.load(out / "inference.onnx"), onnx.load(tmp_path / "python.onnx")
    assert [value.name for value in runtime.graph.output] == names == [value.name for value in python.graph.output]
    assert list(runtime.graph.node) == list(python.graph.node)
    assert list(runtime.graph.input) == list(python.graph.input)
    held = {init.name: onnx.numpy_helper.to_array(init) for init in runtime.graph.initializer}
    expected = {init.name: onnx.numpy_helper.to_array(init) for init in python.graph.initializer}
    assert sorted(held) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(held[name], value, rtol=0, atol=CASES[case], err_msg=name)
    eval_inputs = [entry["name"] for entry in json.loads((package / "manifest.json").read_text())["eval"]["inputs"]]
    evaluation = dict(zip(eval_inputs, fixture_batches(case, STEPS)[1]))
    feeds = {value.name: evaluation[value.name] for value in runtime.graph.input}
    paths = (out / "inference.onnx", tmp_path / "python.onnx")
    ran = [onnxruntime.InferenceSession(str(path)).run(None, feeds) for path in paths]
    for got, want in zip(*ran):
        np.testing.assert_allclose(got, want, rtol=0, atol=10 * CASES[case])


LOAD_SCRIPT = """
import json, sys
from onnxruntime.training.api import CheckpointState
state = CheckpointState.load_checkpoint(sys.argv[1])
values = {name: state.parameters[name].data.ravel().tolist() for name in sys.argv[2:]}
print(json.dumps([values, state.properties["epoch"], state.properties["note"]]))
"""


@pytest.mark.ort_peer
@pytest.mark.skipif(not ORT_PYTHON.exists(), reason=f"no onnxruntime-training python at {ORT_PYTHON}")
def test_onnx_runtime_loads_the_checkpoint_the_runtime_saved(c_run: tuple[str, Path, Path]) -> None:
    _, _, out = c_run
    saved = TrainingState.load((out / "checkpoint").read_bytes())
    names = list(saved.params)
    found = run_ort(LOAD_SCRIPT, out / "checkpoint", *names)
    assert isinstance(found, list) and found[1:] == [3, "packaged"]
    loaded = found[0]
    assert sorted(loaded) == sorted(names)
    for name in names:
        np.testing.assert_array_equal(np.float32(loaded[name]), saved.params[name].detach().numpy().ravel())


@pytest.mark.parametrize(
    ("line", "replacement", "named"),
    [
        ("torch ", "torch 1.0.0", "was built for another torch version: '1.0.0'"),
        ("machine ", "machine riscv64", "was built for another CPU architecture: 'riscv64'"),
        ("program train ", "program train ../train_step", "the file '../train_step', which holds a path"),
        ("program train ", "program train /etc/passwd", "entry 'program train' of native_steps.txt names the file "),
        ("program train ", "program train a/b", "'a/b', which holds a path separator; expected the name of a file"),
        ("program train ", "program train ..", "the file '..', which names a folder"),
        ("program train ", "program train a\x01b", "the file 'a\\x01b', which holds a control character"),
        ("end", "", "native_steps.txt is incomplete"),
        (  # an older package: its optimizer program takes one tensor per parameter
            "ort-torch-train-native/",
            "ort-torch-train-native/2",
            "native_steps.txt is of format 'ort-torch-train-native/2', this runtime reads 'ort-torch-train-native/3'; "
            "rebuild the package",
        ),
        (
            "parameter trainable 0.bias ",
            "parameter trainable 0.bias float32 1 31",
            "parameter '0.bias' is float32 [31]",
        ),
    ],
)
def test_a_package_built_elsewhere_or_damaged_is_a_status_naming_which(
    built: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    line: str,
    replacement: str,
    named: str,
) -> None:
    edited = tmp_path / "package"
    shutil.copytree(_package(CASE, tmp_path_factory), edited)
    description = edited / "native_steps.txt"
    lines = [replacement if text.startswith(line) else text for text in description.read_text().splitlines()]
    description.write_text("".join(f"{text}\n" for text in lines if text))
    done = _run_c(built[1], edited, CASE, tmp_path)
    assert done.returncode == 1 and "CreateTrainingSession" in done.stderr and named in done.stderr, done.stderr


def _edited_export(package: Path, folder: Path, model_file: str, program_file: str) -> Path:
    """A copy of package whose description names model_file and program_file for its export 0."""
    edited = folder / "package"
    shutil.copytree(package, edited)
    description = edited / "native_steps.txt"
    lines = [
        f"export 0 {model_file} {program_file}" if text.startswith("export 0 ") else text
        for text in description.read_text().splitlines()
    ]
    description.write_text("".join(f"{text}\n" for text in lines))
    return edited


@pytest.mark.parametrize("name", ["../export_0.onnx", "/etc/passwd"])
def test_an_export_file_named_outside_the_package_is_a_status_of_the_call_that_reads_it(
    built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, name: str
) -> None:
    """ExportModelForInferencing reads the export's model file and CreateSession (tests/native/packaged_boundary.c,
    which runs the model it exported) its program: each refuses a name that leaves the package, naming it."""
    package = _package(CASE, tmp_path_factory)
    edited = _edited_export(package, tmp_path / "model", name, "export_0")
    done = _run_c(built[1], edited, CASE, tmp_path / "model")
    assert done.returncode == 1 and "ExportModelForInferencing" in done.stderr, done.stderr
    assert f"the entry 'export 0' of native_steps.txt names the file '{name}', which " in done.stderr, done.stderr

    edited = _edited_export(package, tmp_path / "program", "export_0.onnx", name)
    (tmp_path / "program" / "out").mkdir()
    boundary = packaged_program(tmp_path_factory, PROGRAMS / "packaged_boundary.c")
    arguments = [str(boundary), str(edited), str(MLP / "checkpoint"), str(tmp_path / "program" / "out"), "logits"]
    environment = {**os.environ, "ORT_TORCH_TRAIN_PACKAGE": str(edited)}
    done = subprocess.run([*arguments, str(MLP)], capture_output=True, text=True, env=environment, timeout=scaled(300))
    assert done.returncode == 1 and "CreateSession" in done.stderr, done.stdout[-2000:] + done.stderr
    assert f"the entry 'export 0' of native_steps.txt names the file '{name}', which " in done.stderr, done.stderr


def test_the_command_line_prints_the_runtime_flags(built: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    prefix = built[0]
    assert main(["native", "flags", "--packaged", "--prefix", str(prefix)]) == 0
    flags = packaged_flags(prefix)
    assert capsys.readouterr().out.strip() == shlex.join(flags.cflags + flags.libs)
    assert "-l:libort_torch_train_packaged.so" in flags.libs and not any(
        flag.startswith("-lpython") for flag in flags.libs
    )
