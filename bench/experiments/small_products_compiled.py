"""``compile=True``'s one-graph step with and without ``passes/small_products.py`` (issue 51, item 4).

    .venv/bin/python bench/experiments/small_products_compiled.py [--models mlp batchnorm ...] [--rounds 7]
        [--calls 300] [--out bench/results/STAMP-small-products-compiled]

For each model (tests/fixtures, made by ORT 1.19.2) two modules in one process train through
``module.step(optimizer, *inputs)``: ``compile=True`` (the small products in inductor's loops) and the same with
the post-grad pass as it was before (``compile={"options": {"post_grad_custom_post_pass": cpu_matmuls()}}``: every
product an extern GEMM), one thread, on the fixture's train batches concatenated and cut to 8 and 64 rows, in
blocks alternating between the two, round after round; a block's figure is the process's CPU time per step
(``time.process_time``). Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.passes.onednn_linear import cpu_matmuls

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models_vs_ort import BATCHES, FIXTURES  # noqa: E402  (the corpus models, as the comparison with ORT names them)

ROOT = Path(__file__).resolve().parents[2]
SIDES = {"before (every product extern)": {"options": {"post_grad_custom_post_pass": cpu_matmuls()}}, "after": True}


def batches(fixture: str) -> dict[int, list[np.ndarray]]:
    """The fixture's train inputs at each batch size (its batches concatenated, cut to the size)."""
    expected = json.loads((ROOT / "tests" / "fixtures" / fixture / "expected.json").read_text())
    data = np.load(ROOT / "tests" / "fixtures" / fixture / "data.npz")
    keys = expected["data_keys"]["train"]
    return {
        size: [np.ascontiguousarray(data[key].reshape(-1, *data[key].shape[2:])[:size]) for key in keys]
        for size in BATCHES
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(FIXTURES), default=[m for m in FIXTURES if m != "cnn"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-small-products-compiled", time.gmtime())
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    results: dict[str, dict] = {}
    for model in args.models:
        artifacts = ROOT / "tests" / "fixtures" / FIXTURES[model] / "artifacts"
        inputs = batches(FIXTURES[model])
        steps = {}
        for name, compile in SIDES.items():
            state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
            module = Module(str(artifacts / "training_model.onnx"), state, compile=compile)
            optimizer = Optimizer(str(artifacts / "optimizer_model.onnx"), module)
            optimizer.set_learning_rate(1e-3)
            for size in BATCHES:
                for _ in range(20):
                    module.step(optimizer, *inputs[size])
            steps[name] = (module, optimizer)
        blocks: dict[str, dict[int, list[float]]] = {name: {size: [] for size in BATCHES} for name in SIDES}
        names = list(SIDES)
        for round_index in range(args.rounds):
            for size in BATCHES:
                for name in names[round_index % 2 :] + names[: round_index % 2]:
                    module, optimizer = steps[name]
                    started = time.process_time()
                    for _ in range(args.calls):
                        module.step(optimizer, *inputs[size])
                    blocks[name][size].append((time.process_time() - started) / args.calls * 1e6)
        results[model] = blocks
        print(model, {n: {s: statistics.median(v) for s, v in b.items()} for n, b in blocks.items()}, flush=True)
    load = (load_start, os.getloadavg()[0])
    command = " ".join(
        [".venv/bin/python bench/experiments/small_products_compiled.py", *(sys.argv[1:] if argv is None else argv)]
    )
    lines = [
        "# compile=True's step with small matrix products in inductor's loops, against every product extern",
        "",
        f"`{command}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}; one thread;",
        f"{args.rounds} rounds of blocks of {args.calls} `module.step` calls alternating between the two; CPU time",
        f"per step (process_time); load average {load[0]:.1f} at the start, {load[1]:.1f} at the end (the 2-core VM",
        "shared with other sessions).",
        "",
        "| model | batch 8 before | after | after / before | batch 64 before | after | after / before |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model, blocks in results.items():
        before, after = (blocks[name] for name in names)
        cells = []
        for size in BATCHES:
            b, a = statistics.median(before[size]), statistics.median(after[size])
            cells += [f"{b:.1f} us", f"{a:.1f} us", f"{a / b:.2f}x"]
        lines.append(f"| {model} | {' | '.join(cells)} |")
    text = "\n".join(lines) + "\n"
    Path(f"{out}.md").write_text(text)
    Path(f"{out}.json").write_text(json.dumps({"load_average": load, "blocks": results}, indent=1) + "\n")
    print(text)
    return results


if __name__ == "__main__":
    main()
