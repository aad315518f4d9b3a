"""The Python glue of a package's step alone: its two programs replaced by no-ops (issue 51, item 4).

    .venv/bin/python bench/experiments/package_glue_cost.py [--before PYTHON] [--rounds 4] [--calls 10000]
        [--out bench/results/STAMP-package-glue-cost]

On the mlp fixture's package (bench/.cache/tiny-packages, built by tiny_models_vs_ort.py) at batch 8, one thread:
a ``Module(compile="package:DIR")`` and its ``Optimizer`` take three real steps; then the train and optimizer
programs' runners are swapped for functions that return the train program's last outputs (and nothing), so what
is timed is everything between the user's call and the programs: ``module(x, y)``, ``optimizer.step()``,
``module.lazy_reset_grad()``, the three together and ``module.step(optimizer, x, y)``. Time is the thread's CPU
time (``time.thread_time``), the best of 7 repeats of ``--calls`` calls, so that other processes on a shared
machine inflate it less than wall time. With ``--before`` the same is timed in another checkout's interpreter
(its venv), the two alternating ``--rounds`` times. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = "mlp_ce_adamw_sched"
FORMS = ("module(x, y)", "optimizer.step()", "lazy_reset_grad()", "three calls", "module.step")


def measure(calls: int) -> dict[str, float]:
    """Microseconds of thread CPU time per call of each form, the programs replaced by no-ops."""
    import numpy as np
    import torch

    from ort_torch_train.api import CheckpointState, Module, Optimizer

    torch.set_num_threads(1)
    fixture = ROOT / "tests" / "fixtures" / FIXTURE
    artifacts, package = fixture / "artifacts", ROOT / "bench" / ".cache" / "tiny-packages" / FIXTURE
    keys = json.loads((fixture / "expected.json").read_text())["data_keys"]["train"]
    data = np.load(fixture / "data.npz")
    x, y = (np.ascontiguousarray(data[key].reshape(-1, *data[key].shape[2:])[:8]) for key in keys)
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = Module(str(artifacts / "training_model.onnx"), state, compile=f"package:{package}")
    optimizer = Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(1e-3)
    module.train()
    for _ in range(3):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    train, update = module._engine._train_program, optimizer._engine._program  # the bound programs (bound.py)
    assert train is not None and update is not None
    outputs = train._run([torch.from_numpy(x), torch.from_numpy(y), *train._arguments.current(), *train._flags[1]])
    train._run = lambda arguments: outputs
    update._run = lambda arguments: None  # type: ignore[attr-defined]

    def three() -> None:
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()

    forms = {
        "module(x, y)": lambda: module(x, y),
        "optimizer.step()": optimizer.step,
        "lazy_reset_grad()": module.lazy_reset_grad,
        "three calls": three,
        "module.step": lambda: module.step(optimizer, x, y),
    }
    best = {}
    for name, form in forms.items():
        times = []
        for _ in range(7):
            started = time.thread_time()
            for _ in range(calls):
                form()
            times.append((time.thread_time() - started) / calls * 1e6)
        best[name] = min(times)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another checkout's venv interpreter, timed alternately as 'before'")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.calls)))
        return 0
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-package-glue-cost", time.gmtime())
    pythons = {"after": sys.executable, **({"before": args.before} if args.before else {})}
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in pythons}
    for round_index in range(args.rounds):
        order = list(pythons) if round_index % 2 == 0 else list(reversed(pythons))
        for side in order:
            command = [pythons[side], __file__, "--worker", "--calls", str(args.calls)]
            answer = subprocess.run(command, check=True, capture_output=True, text=True, env=environment)
            runs[side].append(json.loads(answer.stdout.strip().splitlines()[-1]))
    load_end = os.getloadavg()[0]
    medians = {side: {form: statistics.median(r[form] for r in runs[side]) for form in FORMS} for side in pythons}
    command = " ".join([".venv/bin/python", *sys.argv])
    lines = [
        "# A package's Python glue alone: its programs replaced by no-ops (issue 51, item 4)",
        "",
        f"`{command}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load_start:.2f} at the "
        f"start, {load_end:.2f} at the end (2 cores shared with other sessions); mlp fixture's package, batch 8, one "
        f"thread; thread CPU microseconds per call, median over {args.rounds} processes per side of the best of 7 "
        f"repeats of {args.calls} calls.",
        "",
        "| form | " + " | ".join(pythons) + (" | after / before |" if "before" in pythons else " |"),
        "|---|" + "---:|" * (len(pythons) + ("before" in pythons)),
    ]
    for form in FORMS:
        cells = [f"{medians[side][form]:.2f}" for side in pythons]
        if "before" in pythons:
            cells.append(f"{medians['after'][form] / medians['before'][form]:.2f}x")
        lines.append(f"| {form} | " + " | ".join(cells) + " |")
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
    Path(f"{out}.json").write_text(json.dumps({"command": command, "load": [load_start, load_end], "runs": runs}))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
