"""A package's Python step in its two call forms, this checkout against another, in one run (issue 51, item 4).

    .venv/bin/python bench/experiments/package_call_forms.py --before /work/wt/base52/.venv/bin/python
        [--models mlp batchnorm ...] [--rounds 5] [--block-seconds 0.03] [--out bench/results/STAMP-package-call-forms]

For each model it starts ORT 1.19.2's side and two ``Module(compile="package:DIR")`` sides
(``tiny_models_worker.py``: this checkout's interpreter, and ``--before``'s on the same package) and times, in
blocks alternating between the sides and the forms, the three calls (``module(*inputs)``, ``optimizer.step()``,
``module.lazy_reset_grad()``: ``run``) and ``module.step(optimizer, *inputs)`` (``step``), at batch 8 and 64,
round after round (the order rotated each round). The packages and inputs are those tiny_models_vs_ort.py builds
into bench/.cache (run it once first). Reported: each side's median block, microseconds per step, and its ratio
to ORT's three calls at the same model and batch. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from tiny_models_vs_ort import BATCHES, CACHE, FIXTURES, HERE, ROOT, Worker, write_inputs

FORMS = ("run", "step")


def measure(model: str, arguments: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    """The blocks of each side and form (``ort run``, ``after run``, ``after step``, ``before ...``), per batch."""
    fixture = FIXTURES[model]
    artifacts = ROOT / "tests" / "fixtures" / fixture / "artifacts"
    package = CACHE / "tiny-packages" / fixture
    if not (package / "manifest.json").is_file():
        raise SystemExit(f"no package at {package}: run bench/experiments/tiny_models_vs_ort.py --sides ort package")
    inputs = CACHE / "tiny-inputs" / fixture
    write_inputs(fixture, inputs)
    worker = str(HERE / "tiny_models_worker.py")
    pythons = {"after": sys.executable, "before": str(arguments.before)}
    workers = {"ort": Worker([arguments.ort_python, worker, "ort", str(artifacts), str(inputs)])}
    for name, python in pythons.items():
        workers[name] = Worker([python, worker, "package", str(artifacts), str(inputs), str(package)])
    sides = [("ort", "run")] + [(name, form) for name in pythons for form in FORMS]
    try:
        calls = {}
        for batch in BATCHES:
            for name, form in sides:
                workers[name].block(form, batch, 20)
            calls[batch] = int(
                min(3000, max(20, arguments.block_seconds / (workers["ort"].block("run", batch, 50) * 1e-6)))
            )
        blocks: dict[str, dict[int, list[float]]] = {f"{n} {f}": {b: [] for b in BATCHES} for n, f in sides}
        for round_index in range(arguments.rounds):
            order = sides[round_index % len(sides) :] + sides[: round_index % len(sides)]
            for batch in BATCHES:
                for name, form in order:
                    blocks[f"{name} {form}"][batch].append(workers[name].block(form, batch, calls[batch]))
        for each in workers.values():
            each.quit()
    finally:
        for each in workers.values():
            if each.process.poll() is None:
                each.process.kill()
                each.process.wait()
    return blocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout's venv interpreter")
    parser.add_argument("--models", nargs="+", choices=sorted(FIXTURES), default=["mlp", "batchnorm", "l1"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=0.03)
    parser.add_argument("--ort-python", default=str(ROOT / ".venv-ort" / "bin" / "python"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-package-call-forms", time.gmtime())
    load_start = os.getloadavg()[0]
    results = {model: measure(model, args) for model in args.models}
    load_end = os.getloadavg()[0]
    command = " ".join([".venv/bin/python", *sys.argv])
    sides = list(next(iter(results.values())))
    lines = [
        "# A package's Python step: three calls and module.step, this checkout against another (issue 51, item 4)",
        "",
        f"`{command}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load_start:.2f} at the "
        f"start, {load_end:.2f} at the end (2 cores shared with other sessions); one thread per side; median of "
        f"{args.rounds} blocks, microseconds per step; the ratios are to ORT's three calls in the same run.",
        "",
        "| model | batch | " + " | ".join(sides) + " | " + " | ".join(f"{s} / ORT" for s in sides[1:]) + " |",
        "|---|---:|" + "---:|" * (2 * len(sides) - 1),
    ]
    for model, blocks in results.items():
        for batch in BATCHES:
            medians = {side: statistics.median(blocks[side][batch]) for side in sides}
            ort = medians["ort run"]
            cells = [f"{medians[s]:.1f}" for s in sides] + [f"{medians[s] / ort:.2f}x" for s in sides[1:]]
            lines.append(f"| {model} | {batch} | " + " | ".join(cells) + " |")
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
    Path(f"{out}.json").write_text(json.dumps({"command": command, "load": [load_start, load_end], "results": results}))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
