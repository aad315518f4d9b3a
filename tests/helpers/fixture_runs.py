"""A committed fixture's batches written as the raw input files the C test programs read (train_parity.c,
packaged_runtime.c), and the reference run those programs are compared with: the same training through the
Python API."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from tests.helpers.paths import FIXTURES

ELEM_TYPES = {"float32": 1, "int64": 7}  # ONNX's element types of the fixtures' inputs


def fixture_batches(name: str, steps: int, root: Path = FIXTURES) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """The first ``steps`` training batches of the fixture ``name`` in the folder ``root`` (one list of inputs per
    step; past its last batch, its batches again from the first) and its eval inputs."""
    expected = json.loads((root / name / "expected.json").read_text())
    data = np.load(root / name / "data.npz")
    keys = expected["data_keys"]["train"]
    train = [[data[key][step % len(data[key])] for key in keys] for step in range(steps)]
    return train, [data[key] for key in expected["data_keys"]["eval"]]


def write_raw_inputs(name: str, folder: Path, steps: int, *extra_lines: str, root: Path = FIXTURES) -> None:
    """``folder``/manifest.txt (one line per input: kind, index, element type, rank, shape; then ``extra_lines``)
    and each input's raw bytes: train_STEP_K.bin, eval_K.bin (the fixture ``name`` in the folder ``root``)."""
    folder.mkdir(parents=True)
    train, evaluation = fixture_batches(name, steps, root)
    lines = []
    for kind, arrays in (("train", train[0]), ("eval", evaluation)):
        for k, array in enumerate(arrays):
            lines.append(f"{kind} {k} {ELEM_TYPES[array.dtype.name]} {array.ndim} {' '.join(map(str, array.shape))}")
    for step, arrays in enumerate(train):
        for k, array in enumerate(arrays):
            np.ascontiguousarray(array).tofile(folder / f"train_{step}_{k}.bin")
    for k, array in enumerate(evaluation):
        np.ascontiguousarray(array).tofile(folder / f"eval_{k}.bin")
    (folder / "manifest.txt").write_text("\n".join([*lines, *extra_lines]) + "\n")


@dataclass
class PythonRun:
    """A finished reference run: its module (in eval mode) and state, the loss of each step and the eval loss."""

    module: Module
    state: CheckpointState
    losses: np.ndarray
    eval_loss: np.ndarray


def python_run(
    name: str,
    steps: int,
    compile: bool | str,
    schedule: tuple[int, int],
    accumulated: int | None = None,
    root: Path = FIXTURES,
) -> PythonRun:
    """The fixture trained through the Python API for ``steps`` steps with a LinearLRScheduler (warm-up and total
    steps ``schedule``, from 0.01), then evaluated; after step ``accumulated`` (counted from 0) neither the optimizer
    steps nor the gradients reset, so the next step adds to them. ``root``: the folder holding the fixture."""
    artifacts = root / name / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(
        os.fspath(artifacts / "training_model.onnx"), state, os.fspath(artifacts / "eval_model.onnx"), compile=compile
    )
    optimizer = Optimizer(os.fspath(artifacts / "optimizer_model.onnx"), module)
    scheduler = LinearLRScheduler(optimizer, *schedule, 0.01)
    train, evaluation = fixture_batches(name, steps, root)
    losses = []
    for step, inputs in enumerate(train):
        losses.append(np.asarray(module(*inputs), np.float32).reshape(-1))
        if step != accumulated:
            optimizer.step()
            module.lazy_reset_grad()
            scheduler.step()
    module.eval()
    eval_loss = np.asarray(module(*evaluation), np.float32)
    return PythonRun(module, state, np.concatenate(losses), eval_loss)
