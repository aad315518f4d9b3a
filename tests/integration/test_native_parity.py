"""C programs trained through libort_torch_train give what the Python API gives, bit for bit: losses, eval
loss, parameters, checkpoint bytes and exported model bytes, for 20 steps on the committed fixtures, eager
and with ``compile=True`` (the ``ort_torch_train.compile`` session option); and ORT-format (.ort) artifacts,
from files and from buffers, train through the C API as the ONNX artifacts do."""

from __future__ import annotations

from pathlib import Path

import pytest

from ort_torch_train.api import CheckpointState
from tests.conftest import SUITE_THREADS
from tests.helpers.fixture_runs import python_run, write_raw_inputs
from tests.helpers.native import PROGRAMS, NativeBuild, build_native
from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled

STEPS = 20
MLP = "mlp_ce_adamw_sched"
FIXTURE_NAMES = (MLP, "cnn", "transformer")


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    return build_native(tmp_path_factory)


def run_c(
    native: NativeBuild, root: Path, names: tuple[str, ...], compile: bool, ort_format: tuple[str, ...] = ()
) -> dict[str, Path]:
    """Train each fixture through the C API in one process, then the mlp fixture's ORT-format artifacts read as
    each of ``ort_format`` ("files", "buffers") says, on the mlp fixture's data; the output folder of each (by
    fixture name, and "ort-files", "ort-buffers")."""
    jobs, outputs = [], {}
    for name in names:
        data, out = root / f"{name}-data", root / f"{name}-c"
        write_raw_inputs(name, data, STEPS, "export logits")
        out.mkdir()
        jobs.append(f"{FIXTURES / name / 'artifacts'}:{data}:{out}:{STEPS}:{int(compile)}")
        outputs[name] = out
    mlp_data = root / f"{MLP}-data"
    if ort_format and not mlp_data.is_dir():
        write_raw_inputs(MLP, mlp_data, STEPS, "export logits")
    for reading in ort_format:
        out = root / f"ort-{reading}"
        out.mkdir()
        models = f"{FIXTURES / MLP / 'artifacts_ort'}:ort:{int(reading == 'buffers')}"
        jobs.append(f"{FIXTURES / MLP / 'artifacts'}:{mlp_data}:{out}:{STEPS}:{int(compile)}:{models}")
        outputs[f"ort-{reading}"] = out
    done = native.run(native.program(PROGRAMS / "train_parity.c"), *jobs, threads=SUITE_THREADS, timeout=scaled(600))
    assert done.returncode == 0, done.stdout + done.stderr
    return outputs


@pytest.fixture(scope="session")
def eager_c_runs(native: NativeBuild, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixtures and the mlp fixture's ORT-format artifacts (from files and from buffers) trained eagerly
    through the C API, in one process."""
    return run_c(native, tmp_path_factory.mktemp("eager_c_runs"), FIXTURE_NAMES, False, ("files", "buffers"))


def run_python(name: str, out: Path, compile: bool) -> None:
    """The same run through the Python API, written like train_parity.c writes it."""
    out.mkdir()
    run = python_run(name, STEPS, compile, (3, STEPS))
    run.losses.tofile(out / "losses.bin")
    run.eval_loss.tofile(out / "eval.bin")
    run.module.get_contiguous_parameters(False).numpy().tofile(out / "params.bin")
    CheckpointState.save_checkpoint(run.state, out / "checkpoint", True)
    run.module.export_model_for_inferencing(out / "inference.onnx", ["logits"])


def assert_same_files(c_out: Path, python_out: Path) -> None:
    for file in ("losses.bin", "eval.bin", "params.bin", "checkpoint", "inference.onnx"):
        assert (c_out / file).read_bytes() == (python_out / file).read_bytes(), f"{c_out.name}: {file}"
    assert len((c_out / "losses.bin").read_bytes()) >= 4 * STEPS


def test_c_api_matches_python_api_bit_for_bit(eager_c_runs: dict[str, Path], tmp_path: Path) -> None:
    for name in FIXTURE_NAMES:  # trained in one process
        run_python(name, tmp_path / f"{name}-python", compile=False)
        assert_same_files(eager_c_runs[name], tmp_path / f"{name}-python")


@pytest.mark.compile
def test_c_api_compiled_matches_python_api_compiled(native: NativeBuild, tmp_path: Path) -> None:
    c_out = run_c(native, tmp_path, (MLP,), compile=True)[MLP]
    run_python(MLP, tmp_path / "python", compile=True)
    assert_same_files(c_out, tmp_path / "python")


def test_c_api_trains_ort_format_artifacts_as_the_onnx_ones(eager_c_runs: dict[str, Path]) -> None:
    """CreateTrainingSession from .ort files and CreateTrainingSessionFromBuffer from their bytes, in one process
    with the ONNX run: the same losses, eval loss, parameters and checkpoint bytes."""
    for label in ("ort-files", "ort-buffers"):
        for file in ("losses.bin", "eval.bin", "params.bin", "checkpoint"):
            assert (eager_c_runs[label] / file).read_bytes() == (eager_c_runs[MLP] / file).read_bytes(), (label, file)
        assert (eager_c_runs[label] / "inference.onnx").stat().st_size > 0
