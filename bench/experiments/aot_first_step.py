"""A fresh process's first step with ``compile="aot"`` against ``compile=True`` (issue 51, item 4): for each mode, a
new compile cache, a first process (cold: it compiles) and a second on the same cache (warm: it loads).

    .venv/bin/python bench/experiments/aot_first_step.py [--out bench/results/STAMP-aot-first-step]

Each process, on the mlp_ce_adamw_sched fixture at batch 8, after its imports (timed apart) creates the Module (with
the eval model) and the Optimizer and takes one step (``module(x, y)``, ``optimizer.step()``,
``module.lazy_reset_grad()``), and prints the seconds. Writes OUT.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("aot", "true")


def child(cache: str, mode: str) -> None:
    started = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    from ort_torch_train.api import Module, Optimizer
    from tests.helpers.corpus import Case
    from tests.helpers.paths import FIXTURES

    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    imported = time.perf_counter()
    compile = True if mode == "true" else mode
    module = Module(
        case.artifact("training_model.onnx"),
        case.load_state(),
        case.artifact("eval_model.onnx"),
        compile=compile,
        compile_cache=cache,
    )
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    x, y = case.train_inputs(0)
    float(module(x, y))
    optimizer.step()
    module.lazy_reset_grad()
    print(f"{imported - started:.2f} {time.perf_counter() - imported:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-aot-first-step", time.gmtime())
    load = [os.getloadavg()[0]]
    rows = []
    for mode in MODES:
        with tempfile.TemporaryDirectory() as cache:
            for run in ("cold", "warm"):
                command = [sys.executable, __file__, "child", cache, mode]
                done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
                imports, first = done.stdout.split()[-2:]
                rows.append(f"| {'True' if mode == 'true' else repr(mode)} | {run} | {imports} | {first} |")
    load.append(os.getloadavg()[0])
    text = "\n".join(
        [
            '# A fresh process\'s first step: compile="aot" against compile=True (issue 51, item 4)',
            "",
            f"`.venv/bin/python bench/experiments/aot_first_step.py`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())};",
            f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end (2 cores shared with other sessions).",
            "",
            "| compile | cache | imports (s) | Module + Optimizer + first step (s) |",
            "|---|---|---:|---:|",
            *rows,
        ]
    )
    Path(f"{out}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
