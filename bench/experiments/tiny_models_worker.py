"""One side of bench/experiments/tiny_models_vs_ort.py in its own process, driven over stdin/stdout as the C side
(packaged_step_loop.c) is.

    PYTHON tiny_models_worker.py SIDE ARTIFACTS_DIR INPUTS_DIR [PACKAGE_DIR]

SIDE is ``ort`` (onnxruntime-training's Python API; run with its venv's Python), ``compiled``
(``Module(compile=True)``), ``package`` (``Module(compile="package:DIR")``) or ``aot`` (``Module(compile="aot",
compile_cache=False)``: the optimizer program compiled as the optimizer is created, the train program at the first
step, both in this process). After its imports it loads the
checkpoint, creates the module and optimizer (learning rate 1e-3, one intra-op thread) and takes one step at the
first batch of INPUTS_DIR/manifest.txt, timing that, and prints ``ready CREATE_S FIRST_STEP_S LIBPYTHON_LINES``; then each
``run BATCH N`` line takes N steps (``loss = module(*inputs)``, ``optimizer.step()``, ``module.lazy_reset_grad()``)
and answers ``us MICROSECONDS_PER_STEP``; ``step BATCH N`` does the same through ``module.step(optimizer, *inputs)``
(ours only: the three calls as one compiled call where ``compile=True``); ``quit`` answers ``peak_kb VmHWM``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

DTYPES = {1: np.float32, 7: np.int64, 9: np.bool_}


def read_batches(folder: Path) -> dict[int, list[np.ndarray]]:
    """The train inputs per batch size, as packaged_step_loop.c reads them."""
    batches: dict[int, dict[int, np.ndarray]] = {}
    for line in (folder / "manifest.txt").read_text().splitlines():
        size, index, element, rank, *dims = (int(word) for word in line.split())
        assert len(dims) == rank, line
        array = np.fromfile(folder / f"b{size}_{index}.bin", dtype=DTYPES[element]).reshape(dims)
        batches.setdefault(size, {})[index] = array
    return {size: [arrays[k] for k in sorted(arrays)] for size, arrays in batches.items()}


def status_value(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return -1


def imported(side: str) -> tuple:
    """The side's ``(CheckpointState, Module, Optimizer, session options)``, imported (not timed)."""
    if side == "ort":
        import onnxruntime as ort
        from onnxruntime.training.api import CheckpointState, Module, Optimizer

        ort.set_default_logger_severity(3)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        return CheckpointState, Module, Optimizer, {"device": "cpu", "session_options": options}
    import torch

    from ort_torch_train.api import CheckpointState, Module, Optimizer

    torch.set_num_threads(1)
    return CheckpointState, Module, Optimizer, {}


def create(side: str, artifacts: Path, package: str | None, api: tuple) -> tuple:
    """The module (train mode) and optimizer (learning rate 1e-3) of the side over the artifacts."""
    checkpoint_state, module_class, optimizer_class, options = api
    if side != "ort":
        compile = {"compiled": True, "aot": "aot"}.get(side, f"package:{package}")
        options = {"compile": compile, **({"compile_cache": False} if side == "aot" else {})}
    state = checkpoint_state.load_checkpoint(str(artifacts / "checkpoint"))
    module = module_class(str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"), **options)
    optimizer = optimizer_class(str(artifacts / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(1e-3)
    module.train()
    return module, optimizer


def main() -> int:
    side, artifacts, inputs_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    package = sys.argv[4] if len(sys.argv) > 4 else None
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of the libraries go to stderr
    batches = read_batches(inputs_dir)
    api = imported(side)
    started = time.perf_counter()
    module, optimizer = create(side, artifacts, package, api)
    created = time.perf_counter()
    first = batches[next(iter(batches))]
    module(*first)
    optimizer.step()
    module.lazy_reset_grad()
    stepped = time.perf_counter()
    libpython = sum("libpython" in line for line in Path("/proc/self/maps").read_text().splitlines())
    answers.write(f"ready {created - started:.6f} {stepped - created:.6f} {libpython}\n")
    for line in sys.stdin:
        words = line.split()
        if words[0] == "quit":
            break
        arrays, calls = batches[int(words[1])], int(words[2])
        if words[0] == "step":
            begin = time.perf_counter()
            for _ in range(calls):
                module.step(optimizer, *arrays)
        else:
            begin = time.perf_counter()
            for _ in range(calls):
                module(*arrays)
                optimizer.step()
                module.lazy_reset_grad()
        answers.write(f"us {(time.perf_counter() - begin) / calls * 1e6:.4f}\n")
    answers.write(f"peak_kb {status_value('VmHWM:')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
