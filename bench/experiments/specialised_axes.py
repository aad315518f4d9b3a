"""Dynamo graphs and seconds of compiled steps over new shapes whose length torch specialises (an LSTM's
time loop, T5's relative-position buckets), for a before/after comparison of remembered fallbacks.

    ORT_TORCH_TRAIN_THREADS=2 .venv/bin/python bench/experiments/specialised_axes.py ROOT DIR ROW SHAPES OUT.json

ROW: lstm or t5, whose artifacts ``first_compiled_step.py export DIR`` writes under DIR/<ROW> (batch and
sequence axes dynamic). SHAPES: batch x length per step, e.g. 2x8,2x6,3x6. Trains ROW with
``compile=True`` (inductor, ``compile_cache=False``) on the checkout at ROOT (its ``ort_torch_train`` and
``adapters``: another commit's, for a "before" figure) and writes the Dynamo graphs after each step, each
step's seconds and loss to OUT.json. Pin the threads (``ORT_TORCH_TRAIN_THREADS``) so that step times
do not move with the load-following policy's count.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))

from checkout import import_checkout  # noqa: E402


def main() -> None:
    root, directory, row, shapes_text, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])
    import_checkout(root)
    import numpy as np
    from torch._dynamo.utils import counters

    from ort_torch_train.api import CheckpointState, Module, Optimizer

    rng = np.random.default_rng(0)
    shapes = [tuple(int(size) for size in shape.split("x")) for shape in shapes_text.split(",")]
    vocab, classes = (12, 3) if row == "lstm" else (32, 32)
    batches = [
        (rng.integers(0, vocab, shape), rng.integers(0, classes, shape[0] if row == "lstm" else shape[0] * shape[1]))
        for shape in shapes
    ]
    state = CheckpointState.load_checkpoint(directory / row / "checkpoint")
    module = Module(directory / row / "training_model.onnx", state, compile=True, compile_cache=False)
    optimizer = Optimizer(directory / row / "optimizer_model.onnx", module)
    result: dict = {"row": row, "root": root, "shapes": shapes, "losses": [], "graphs_after_step": [], "step_s": []}
    started = time.perf_counter()
    for batch in batches:
        step_started = time.perf_counter()
        result["losses"].append(float(np.asarray(module.step(optimizer, *batch)).reshape(-1)[0]))
        result["step_s"].append(round(time.perf_counter() - step_started, 1))
        result["graphs_after_step"].append(counters["stats"]["unique_graphs"])
    result["total_s"] = round(time.perf_counter() - started, 1)
    out.write_text(json.dumps(result))
    print(result)


if __name__ == "__main__":
    main()
