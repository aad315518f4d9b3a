"""ORT-format (.ort) copies of a fixture's artifacts, made by onnxruntime-training 1.19.2 itself, and ORT's
own training run on them.

``artifacts_ort/{training,eval,optimizer}_model.ort`` come from ``convert_onnx_models_to_ort`` with the
``Fixed`` optimization style: the call ``generate_artifacts(..., ort_format=True)`` makes for each model
(ORT's optimizers run first, so Gemm+Relu becomes com.microsoft FusedGemm). ORT orders part of the file
(its kernel type table) by hash-map iteration, which follows memory addresses: the conversion runs in a
subprocess started like ``fixture_optim_runner`` (``setarch -R``, a fixed environment and fixed file names),
which made reruns byte-identical here. ``artifacts_ort/ort_run.npz``
holds ORT's run on them: ``losses[20]`` (constant learning rate ``spec.lr``, loop ``module(x, y);
optimizer.step(); module.lazy_reset_grad()`` from ``artifacts/checkpoint``), ``eval_loss`` and ``params``
(``get_contiguous_parameters()`` after the 20 steps).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import fixture_io as fio
import fixture_record as rec
import numpy as np
from fixture_extras import RUNNER_ENV
from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort
from onnxruntime.training.api import CheckpointState, Module, Optimizer

MODELS = ("training_model", "eval_model", "optimizer_model")
STEPS = 20


def write_ort_format_artifacts(run: rec.FixtureRun) -> None:
    """``artifacts_ort/`` of the fixture: the three models in ORT format and ORT's run on them."""
    out = run.out / "artifacts_ort"
    out.mkdir()
    scratch = Path(tempfile.gettempdir()) / "ort_torch_train_fixture_ort_format"  # one name: its length shifts the heap
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        for name in MODELS:
            shutil.copyfile(run.art / f"{name}.onnx", scratch / f"{name}.onnx")
        proc = subprocess.run(
            [*fio.no_aslr_prefix(), sys.executable, str(Path(__file__).resolve())],
            capture_output=True,
            text=True,
            cwd=scratch,
            env=RUNNER_ENV,
        )
        if proc.returncode:
            raise RuntimeError(f"ORT-format conversion failed:\n{proc.stdout}{proc.stderr}")
        for name in MODELS:
            shutil.copyfile(scratch / "ort" / f"{name}.ort", out / f"{name}.ort")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    state = CheckpointState.load_checkpoint(str(run.art / "checkpoint"))
    module = Module(
        str(out / "training_model.ort"), state, str(out / "eval_model.ort"), session_options=rec.session_options()
    )
    optimizer = Optimizer(str(out / "optimizer_model.ort"), module)
    optimizer.set_learning_rate(run.spec.lr)
    losses = []
    for step in range(STEPS):
        module.train()
        losses.append(rec.loss_of(module(*run.batch("train", step))))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    eval_loss = rec.loss_of(module(*run.batch("eval")))
    fio.save_npz(
        out / "ort_run.npz",
        {
            "losses": np.asarray(losses, np.float32),
            "eval_loss": np.asarray(eval_loss, np.float32),
            "params": rec.contiguous(module, False),
        },
    )


def convert_here() -> None:
    """The subprocess: each ``<name>.onnx`` of the working directory converted into ``ort/<name>.ort``, one at a
    time as generate_artifacts converts them."""
    for name in MODELS:
        convert_onnx_models_to_ort(
            Path(f"{name}.onnx"), output_dir=Path("ort"), optimization_styles=[OptimizationStyle.Fixed]
        )


if __name__ == "__main__":
    convert_here()
