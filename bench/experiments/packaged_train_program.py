"""One package's train program called in a loop against another's, in turns, in one process (issue 51, item 4).

    .venv/bin/python bench/experiments/packaged_train_program.py BEFORE_DIR AFTER_DIR [--fixture cnn]
        [--batches 8 64] [--rounds 7] [--block-seconds 0.05] [--out bench/results/STAMP-packaged-train-program]

Both packages must be of the same fixture's artifacts (``ort-torch-train package``). Each train program
(``train_step``; ``train_step.pt2`` in a package built before program folders), loaded by libtorch's loader as the
runtime with no Python loads it, is called with the
fixture's first train batches cut to the size, its checkpoint's parameters, zeroed gradients and the reset flag
set; blocks alternate between the two packages, round after round, one thread. A block's figure is the process's
CPU time per call (``time.process_time``: less disturbed than the wall clock on a shared machine), the Python call
of the loader's ``run`` included, with Python's garbage collector off (its collections, set off by the lists each
call returns, would land in either side's blocks). Reported: each package's median block (microseconds per call)
and after / before, and the largest difference between the two programs' gradients. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from ort_torch_train.api import CheckpointState
from ort_torch_train.torch_internals import aoti_package_runner

ROOT = Path(__file__).resolve().parents[2]


def arguments_of(package: Path, fixture: str, batch: int) -> tuple[list[torch.Tensor], int]:
    """The train program's arguments (inputs, trainable and frozen parameters, gradients, reset) and the
    gradients' count."""
    folder = ROOT / "tests" / "fixtures" / fixture
    expected = json.loads((folder / "expected.json").read_text())
    data = np.load(folder / "data.npz")
    inputs = [
        torch.from_numpy(np.ascontiguousarray(data[key].reshape(-1, *data[key].shape[2:])[:batch]))
        for key in expected["data_keys"]["train"]
    ]
    state = CheckpointState.load_checkpoint(str(folder / "artifacts" / "checkpoint"))
    manifest = json.loads((package / "manifest.json").read_text())

    def tensors(role: str) -> list[torch.Tensor]:
        return [torch.from_numpy(np.array(state.parameters[entry["name"]].data)) for entry in manifest[role]]

    params, frozen = tensors("trainable"), tensors("frozen")
    grads = [torch.zeros_like(p) for p in params]
    return [*inputs, *params, *frozen, *grads, torch.tensor(True)], len(grads)


def _train_program(package: Path) -> Path:
    """The package's train program: its folder, or the archive file of a package built before program folders."""
    folder = package / "train_step"
    return folder if folder.is_dir() else package / "train_step.pt2"


def block(run, arguments: list[torch.Tensor], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        run(arguments)
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--fixture", default="cnn")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.05)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-packaged-train-program", time.gmtime())
    runs = {side: aoti_package_runner(str(_train_program(getattr(args, side)))) for side in ("before", "after")}
    load_start = os.getloadavg()[0]
    gc.collect()
    gc.freeze()
    gc.disable()
    rows = []
    for batch in args.batches:
        arguments = {side: arguments_of(getattr(args, side), args.fixture, batch) for side in runs}
        for side, run in runs.items():
            block(run, arguments[side][0], 20)
        calls = max(10, int(args.block_seconds / (block(runs["before"], arguments["before"][0], 20) * 1e-6)))
        times: dict[str, list[float]] = {side: [] for side in runs}
        for round_index in range(args.rounds):
            for side in list(runs)[round_index % 2 :] + list(runs)[: round_index % 2]:
                times[side].append(block(runs[side], arguments[side][0], calls))
        count = arguments["before"][1]
        gradient_gap = max(
            float((a - b).abs().max())
            for a, b in zip(arguments["before"][0][-1 - count : -1], arguments["after"][0][-1 - count : -1])
        )
        before, after = statistics.median(times["before"]), statistics.median(times["after"])
        rows.append(
            {
                "batch": batch,
                "before_us": before,
                "after_us": after,
                "ratio": after / before,
                "gradient_gap": gradient_gap,
                "blocks": times,
            }
        )
    load_end = os.getloadavg()[0]
    lines = [
        f"# {args.fixture}'s train program: {args.after} against {args.before}",
        "",
        f"`.venv/bin/python bench/experiments/packaged_train_program.py {args.before} {args.after} --fixture {args.fixture} --rounds {args.rounds} --block-seconds {args.block_seconds}`; load average {load_start:.1f} at the start, {load_end:.1f} at the end; medians of {args.rounds} alternating blocks, CPU time per call, one thread.",
        "",
        "| batch | before | after | after / before | largest gradient difference |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {r['batch']} | {r['before_us']:.1f} us | {r['after_us']:.1f} us | {r['ratio']:.2f}x | {r['gradient_gap']:.1e} |"
            for r in rows
        ),
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"load": [load_start, load_end], "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
