"""The unmodified examples/native programs (train.c, train.cpp: written for ONNX Runtime, model files in) train
through the runtime with no Python (issue 51, item 2): their model files resolve to the package built from them
(``$ORT_TORCH_TRAIN_PACKAGE``, or ``package/`` beside the models), no libpython is loaded, they export their model and
run it in the runtime, and they print what the Python engine computes for the same program; models other than the
package's are refused naming the one that differs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.api import LinearLRScheduler, Module, Optimizer
from ort_torch_train.state.training_state import TrainingState
from tests.helpers.native import MLP
from tests.helpers.packaged import fixture_package, packaged_program
from tests.helpers.paths import EXAMPLES
from tests.helpers.timeouts import scaled

CASE = "mlp_ce_adamw_sched"
STEPS, BATCH = 60, 32  # as train.c and train.cpp
pytestmark = [pytest.mark.compile, pytest.mark.slow]


def _batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """train.c's make_batch: its linear congruential generator, column by column."""
    x = np.zeros((BATCH, 20), dtype=np.float32)
    y = np.zeros(BATCH, dtype=np.int64)
    for row in range(BATCH):
        best = 0
        for col in range(20):
            seed = (seed * 1103515245 + 12345) % 2**32
            x[row, col] = np.float32((seed >> 8) % 2001) / np.float32(1000.0) - np.float32(1.0)
            if col < 5 and x[row, col] > x[row, best]:
                best = col
        y[row] = best
    return x, y


def _python_lines() -> tuple[list[str], TrainingState]:
    """The lines train.c prints for its losses and eval loss, and its final state, through the Python API."""
    module = Module(
        str(MLP / "training_model.onnx"),
        TrainingState.load(MLP / "checkpoint"),
        str(MLP / "eval_model.onnx"),
    )
    optimizer = Optimizer(str(MLP / "optimizer_model.onnx"), module)
    scheduler = LinearLRScheduler(optimizer, 5, STEPS, 0.05)
    lines = []
    for step in range(STEPS):
        loss = float(module(*_batch(1000 + step)))
        if step % 10 == 0 or step == STEPS - 1:
            lines.append(f"loss {step} {loss:.6f}")
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
    module.eval()
    lines.append(f"eval_loss {float(module(*_batch(7))):.6f}")
    return lines, module.training_state


def _run(program: Path, artifacts: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    out.mkdir()
    environment = {key: value for key, value in os.environ.items() if key != "ORT_TORCH_TRAIN_PACKAGE"}
    environment.update(env, LD_DEBUG="libs")  # the loader names every library it loads
    return subprocess.run(
        [str(program), str(artifacts), str(out)], capture_output=True, text=True, env=environment, timeout=scaled(300)
    )


def _numbers(lines: list[str]) -> list[float]:
    return [float(line.split()[-1]) for line in lines]


def test_the_unmodified_examples_train_through_the_runtime_as_python_does(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    package = fixture_package(tmp_path_factory, CASE)
    beside = tmp_path / "artifacts"  # a copy of the artifacts with their package beside them: the default rule
    shutil.copytree(MLP, beside)
    shutil.copytree(package, beside / "package")
    runs = {
        "train.c": (MLP, {"ORT_TORCH_TRAIN_PACKAGE": str(package)}),
        "train.cpp": (beside, {}),
    }
    expected, state = _python_lines()
    printed = []
    for source, (artifacts, env) in runs.items():
        out = tmp_path / source
        done = _run(packaged_program(tmp_path_factory, EXAMPLES / "native" / source), artifacts, out, env)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "libort_torch_train_packaged.so" in done.stderr and "libpython" not in done.stderr
        assert "libonnxruntime" not in done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith(("loss", "eval_loss"))]
        assert [line.rsplit(" ", 1)[0] for line in lines] == [line.rsplit(" ", 1)[0] for line in expected]
        np.testing.assert_allclose(_numbers(lines), _numbers(expected), rtol=0, atol=2e-6)
        assert float(done.stdout.split("accuracy ")[1].split()[0]) >= 0.8
        saved = TrainingState.load(out / "checkpoint")
        assert saved.properties == {"epoch": 1} and saved.optimizer is not None
        assert saved.optimizer.step == STEPS
        for name, value in state.state_dict().items():
            np.testing.assert_allclose(saved.state_dict()[name].numpy(), value.numpy(), rtol=0, atol=1e-5, err_msg=name)
        assert (out / "inference.onnx").stat().st_size > 0
        printed.append([line for line in done.stdout.splitlines() if line.startswith(("loss", "eval", "accuracy"))])
    assert printed[0] == printed[1]


def test_models_other_than_the_packages_are_refused_naming_which(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    package = fixture_package(tmp_path_factory, CASE)
    other = tmp_path / "artifacts"
    shutil.copytree(MLP, other)
    with (other / "eval_model.onnx").open("ab") as model:
        model.write(b"\x00")  # another file: another digest
    program = packaged_program(tmp_path_factory, EXAMPLES / "native" / "train.c")
    done = _run(program, other, tmp_path / "out", {"ORT_TORCH_TRAIN_PACKAGE": str(package)})
    assert done.returncode == 1
    assert "was built from another eval_model" in done.stderr and str(other / "eval_model.onnx") in done.stderr
    alone = _run(program, other, tmp_path / "alone", {})  # no variable, no package beside the models
    assert alone.returncode == 1 and f"error 3: CreateTrainingSession: no package at '{other}/package'" in alone.stderr
