"""What a new batch size costs a Module at GPT-2 small's scale: fixed shapes against dynamic axes.

    .venv/bin/python bench/experiments/dynamic_batches.py [--batches 2 2 3 4 5 2] [--threads 2] [--out bench/results]

The model is ``gpt2-124m`` (``harness/models.py``; artifacts by ORT 1.19.2 where ``.venv-ort`` exists:
``input [batch, 128]``, labels flattened to ``[batch * 128]``). Fresh processes, one after the other,
each with an empty inductor cache dir and no compile cache, train ``module.step`` on batches of the
given sizes (rows of the benchmark batch repeated), compiled (``compile=True``) and eager:
``Module(dynamic=False)``, which compiles (eager: converts) the graph for each new size, and
``Module(dynamic=True)`` (the default), which compiles the batch axis and the labels that follow it
once (eager: generalises the graph at the second size). Each step's time, the compiled graphs and the
losses are reported; the settings must give the same losses (eager and compiled to 1e-5). Writes
``<out>/<date>-dynamic-batches.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

SETTINGS = {  # name: (compile, dynamic)
    "compiled, fixed shapes": (True, False),
    "compiled, dynamic axes": (True, True),
    "eager, fixed shapes": (False, False),
    "eager, dynamic axes": (False, True),
}


def child(artifacts: Path, compile: bool, dynamic: bool, batches: list[int], threads: int) -> dict:
    """Train on ``batches`` (row counts) in this process; each step's seconds, the graphs, the losses."""
    import numpy as np
    from runners import ours_module

    from ort_torch_train.api import set_threads
    from ort_torch_train.torch_internals import compile_counters

    set_threads(threads)
    module, optimizer = ours_module(artifacts, 1e-4, compile=compile, dynamic=dynamic, compile_cache=False)
    x, y = np.load(artifacts / "x.npy"), np.load(artifacts / "y.npy")
    labels = y.reshape(len(x), -1)
    steps = []
    for rows in batches:
        inputs, targets = np.resize(x, (rows, x.shape[1])), np.resize(labels, (rows, labels.shape[1])).reshape(-1)
        started = time.perf_counter()
        loss = float(module.step(optimizer, inputs, targets))
        steps.append({"rows": rows, "seconds": time.perf_counter() - started, "loss": loss})
    return {"steps": steps, "graphs": compile_counters()["stats"]["unique_graphs"]}


def run_setting(artifacts: Path, compile: bool, dynamic: bool, batches: list[int], threads: int) -> dict:
    with tempfile.TemporaryDirectory() as inductor_dir:
        command = [sys.executable, __file__, "--threads", str(threads), "--batches", *map(str, batches)]
        command += ["--child", str(artifacts), str(int(compile)), str(int(dynamic))]
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_dir}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"compile={compile}, dynamic={dynamic}: the process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict], batches: list[int]) -> str:
    lines = [
        "| step | rows | " + " | ".join(f"{name}: time" for name in results) + " | loss |",
        "|---" * (3 + len(results)) + "|",
    ]
    for index, rows in enumerate(batches):
        times = [f"{result['steps'][index]['seconds']:.2f} s" for result in results.values()]
        loss = next(iter(results.values()))["steps"][index]["loss"]
        lines.append(f"| {index + 1} | {rows} | " + " | ".join(times) + f" | {loss:.6f} |")
    totals = [f"{sum(s['seconds'] for s in result['steps']):.1f} s" for result in results.values()]
    lines.append("| all | | " + " | ".join(totals) + " | |")
    lines.append("| compiled graphs | | " + " | ".join(str(result["graphs"]) for result in results.values()) + " | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 2, 3, 4, 5, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--child", nargs=3, metavar=("ARTIFACTS", "COMPILE", "DYNAMIC"))
    args = parser.parse_args()
    if args.child:
        compile, dynamic = bool(int(args.child[1])), bool(int(args.child[2]))
        print(json.dumps(child(Path(args.child[0]), compile, dynamic, args.batches, args.threads)))
        return 0

    from model_artifacts import prepare_artifacts
    from models import GPT2_SMALL
    from report import machine_info

    artifacts = prepare_artifacts(GPT2_SMALL, BENCH / ".cache", use_ort=True)
    machine = machine_info("cpu")
    results = {
        name: run_setting(artifacts.directory, compile, dynamic, args.batches, args.threads)
        for name, (compile, dynamic) in SETTINGS.items()
    }
    losses = [[step["loss"] for step in result["steps"]] for result in results.values()]
    differs = max(abs(a - b) for run in losses[1:] for a, b in zip(losses[0], run))
    command = " ".join([".venv/bin/python", "bench/experiments/dynamic_batches.py", *sys.argv[1:]])
    text = (
        f"Command: `{command}`\n\n{machine['cpu']}, {machine['cores']} cores, load average "
        f"{' '.join(f'{v:.2f}' for v in machine['load_average_1_5_15'])} at the start; artifacts by {artifacts.generator}; "
        f"{args.threads} threads, a fresh process per setting with an empty inductor cache dir and no compile cache; "
        f"losses of the settings differ by at most {differs:.1e}; compiled graphs counted by torch.compile.\n\n{table(results, args.batches)}\n"
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-dynamic-batches.md"
    path.write_text(text)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
