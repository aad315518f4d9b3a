"""What a new batch size or length costs a Module at GPT-2 small's scale: fixed shapes against dynamic axes.

    .venv/bin/python bench/experiments/dynamic_batches.py [--batches 2 2 3 4 5 2] [--threads 2] [--out bench/results]
    .venv/bin/python bench/experiments/dynamic_batches.py --lengths 128 128 96 64 112 128 [--batches 2]

The model is ``gpt2-124m`` (``harness/models.py``; artifacts by ORT 1.19.2 where ``.venv-ort`` exists:
``input [batch, 128]``, labels flattened to ``[batch * 128]``). Fresh processes, one after the other,
each with an empty inductor cache dir and no compile cache, train ``module.step`` on batches of the
given sizes (rows of the benchmark batch repeated), compiled (``compile=True``) and eager:
``Module(dynamic=False)``, which compiles (eager: converts) the graph for each new size, and
``Module(dynamic=True)`` (the default), which compiles the batch axis and the labels that follow it
once (eager: generalises the graph at the second size). Each step's time, the compiled graphs and the
losses are reported; the settings must give the same losses (eager and compiled to 1e-5). Writes
``<out>/<date>-dynamic-batches.md``.

``--lengths`` varies the sequence length instead (``--batches``: one row count for every step, or one
per step), on transformers' GPT-2 with GPT-2 small's shape exported with symbolic batch and sequence
axes (``gpu_step.py``'s artifacts: this project's ``generate_artifacts``, random tokens; cached under
``bench/.cache``). Writes ``<out>/<date>-dynamic-lengths.md``.
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


def child(artifacts: Path, compile: bool, dynamic: bool, shapes: list[tuple[int, int]], threads: int) -> dict:
    """Train on batches of ``shapes`` (rows, length; length 0: the benchmark batch's rows) in this process;
    each step's seconds, the graphs, the losses."""
    import numpy as np
    from runners import ours_module

    from ort_torch_train.api import set_threads
    from ort_torch_train.torch_internals import compile_counters

    set_threads(threads)
    module, optimizer = ours_module(artifacts, 1e-4, compile=compile, dynamic=dynamic, compile_cache=False)
    rng = np.random.default_rng(0)
    steps = []
    for rows, length in shapes:
        if length:  # random tokens, the next one the label
            tokens = rng.integers(0, 50257, (rows, length + 1))
            inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
        else:
            x, y = np.load(artifacts / "x.npy"), np.load(artifacts / "y.npy")
            labels = y.reshape(len(x), -1)
            inputs, targets = np.resize(x, (rows, x.shape[1])), np.resize(labels, (rows, labels.shape[1])).reshape(-1)
        started = time.perf_counter()
        loss = float(module.step(optimizer, inputs, targets))
        steps.append({"rows": rows, "length": length, "seconds": time.perf_counter() - started, "loss": loss})
    return {"steps": steps, "graphs": compile_counters()["stats"]["unique_graphs"]}


def run_setting(artifacts: Path, compile: bool, dynamic: bool, shapes: list[tuple[int, int]], threads: int) -> dict:
    with tempfile.TemporaryDirectory() as inductor_dir:
        command = [sys.executable, __file__, "--threads", str(threads)]
        command += ["--batches", *(str(rows) for rows, _ in shapes), "--lengths", *(str(n) for _, n in shapes)]
        command += ["--child", str(artifacts), str(int(compile)), str(int(dynamic))]
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_dir}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"compile={compile}, dynamic={dynamic}: the process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict], shapes: list[tuple[int, int]]) -> str:
    lines = [
        "| step | rows | length | " + " | ".join(f"{name}: time" for name in results) + " | loss |",
        "|---" * (4 + len(results)) + "|",
    ]
    for index, (rows, length) in enumerate(shapes):
        times = [f"{result['steps'][index]['seconds']:.2f} s" for result in results.values()]
        loss = next(iter(results.values()))["steps"][index]["loss"]
        lines.append(f"| {index + 1} | {rows} | {length or 128} | " + " | ".join(times) + f" | {loss:.6f} |")
    totals = [f"{sum(s['seconds'] for s in result['steps']):.1f} s" for result in results.values()]
    lines.append("| all | | | " + " | ".join(totals) + " | |")
    graphs = [str(result["graphs"]) for result in results.values()]
    lines.append("| compiled graphs | | | " + " | ".join(graphs) + " | |")
    return "\n".join(lines)


def length_artifacts(cache: Path) -> tuple[Path, str]:
    """GPT-2 small's shape with symbolic batch and sequence axes (``gpu_step.py``'s artifacts), cached."""
    directory = cache / "gpt2-124m-tokens-ours"
    if not (directory / "checkpoint").is_file():
        from gpu_step import gpt2, make_artifacts

        scratch = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=cache))
        make_artifacts(gpt2(tiny=False, positions=1024), scratch)
        scratch.rename(directory)
    return directory, "this project's generate_artifacts (transformers GPT-2, symbolic batch and sequence)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 2, 3, 4, 5, 2])
    parser.add_argument("--lengths", type=int, nargs="+", help="sequence lengths, one per step (0: 128)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--child", nargs=3, metavar=("ARTIFACTS", "COMPILE", "DYNAMIC"))
    args = parser.parse_args()
    lengths = args.lengths or [0] * len(args.batches)
    batches = args.batches * len(lengths) if len(args.batches) == 1 else args.batches
    if len(batches) != len(lengths):
        parser.error(f"--batches: expected one row count or {len(lengths)} (one per length), got {len(batches)}")
    shapes = list(zip(batches, lengths))
    if args.child:
        compile, dynamic = bool(int(args.child[1])), bool(int(args.child[2]))
        print(json.dumps(child(Path(args.child[0]), compile, dynamic, shapes, args.threads)))
        return 0

    from model_artifacts import prepare_artifacts
    from models import GPT2_SMALL
    from report import machine_info

    if args.lengths:
        directory, generator = length_artifacts(BENCH / ".cache")
    else:
        prepared = prepare_artifacts(GPT2_SMALL, BENCH / ".cache", use_ort=True)
        directory, generator = prepared.directory, prepared.generator
    machine = machine_info("cpu")
    results = {
        name: run_setting(directory, compile, dynamic, shapes, args.threads)
        for name, (compile, dynamic) in SETTINGS.items()
    }
    losses = [[step["loss"] for step in result["steps"]] for result in results.values()]
    differs = max(abs(a - b) for run in losses[1:] for a, b in zip(losses[0], run))
    command = " ".join([".venv/bin/python", "bench/experiments/dynamic_batches.py", *sys.argv[1:]])
    text = (
        f"Command: `{command}`\n\n{machine['cpu']}, {machine['cores']} cores, load average "
        f"{' '.join(f'{v:.2f}' for v in machine['load_average_1_5_15'])} at the start; artifacts by {generator}; "
        f"{args.threads} threads, a fresh process per setting with an empty inductor cache dir and no compile cache; "
        f"losses of the settings differ by at most {differs:.1e}; compiled graphs counted by torch.compile."
        f"\n\n{table(results, shapes)}\n"
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    kind = "lengths" if args.lengths else "batches"
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-dynamic-{kind}.md"
    path.write_text(text)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
