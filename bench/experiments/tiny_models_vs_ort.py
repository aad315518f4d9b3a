"""The corpus models' train step against ONNX Runtime 1.19.2's, at batch 8 and 64, in one run (issue 51, item 4).

    .venv/bin/python bench/experiments/tiny_models_vs_ort.py [--models mlp cnn ...] [--rounds 7]
        [--block-seconds 0.05] [--ort-python .venv-ort/bin/python] [--out bench/results/STAMP-tiny-models-vs-ort]
        [--sides ort native ...] [--native-before PROGRAM [--native-before-packages DIR]]
        [--compiled-before PYTHON] [--package-before PYTHON]

For each model (tests/fixtures, made by ORT 1.19.2) it starts one process per side, each loading the checkpoint,
creating its session and taking a first step (timed inside the process), then drives them in blocks that
alternate between the sides, batch 8 and 64, round after round (the order rotated each round):

- ``ort``: ORT 1.19.2's Python API (its venv's interpreter): ``module(*inputs)``, ``optimizer.step()``,
  ``module.lazy_reset_grad()``, one intra-op thread;
- ``native``: bench/experiments/packaged_step_loop.c over libort_torch_train_packaged (libtorch alone, no Python in
  the process): TrainStep, OptimizerStep, LazyResetGrad on the model's package, timing its own loop;
- ``compiled``: this project's Python API, ``Module(compile=True)``, the same three calls;
- ``compiled-step``: the same process, ``module.step(optimizer, *inputs)`` (the three calls as one compiled call);
- ``package``: ``Module(compile="package:DIR")``, the same three calls;
- ``package-step``: the same process, ``module.step(optimizer, *inputs)``;
- ``aot``: ``Module(compile="aot", compile_cache=False)``, the same three calls: the package's programs compiled in
  the process (the optimizer's as the optimizer is created, the train program at the first step: in the creation
  and first-step figures, not in the blocks);
- ``aot-step``: the same process, ``module.step(optimizer, *inputs)``;
- with ``--compiled-before PYTHON``: ``compiled-before-step``, ``module.step`` run by another checkout's
  interpreter (its venv), for a before/after ratio in the same run;
- with ``--package-before PYTHON``: ``package-before``, the ``package`` side run by another checkout's interpreter.

Every side runs one thread (OMP_NUM_THREADS=1) and the learning rate 1e-3. Packages are built once into
bench/.cache/tiny-packages (not timed) where a native or package side runs. Reported: each side's median block
(microseconds per step) and its ratio to ORT's median at the same model and batch; the process's peak resident
memory (VmHWM) after both batches; the session creation and first step, timed inside each process. Writes OUT.md
and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ort_torch_train.native.build import HEADERS
from ort_torch_train.native.packaged_build import SOURCES, build_packaged, packaged_flags

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = ROOT / "bench" / ".cache"
FIXTURES = {
    "mlp": "mlp_ce_adamw_sched",
    "cnn": "cnn",
    "batchnorm": "bn_frozen_stats",
    "bce": "bce",
    "l1": "l1",
    "regress_mse": "regress_mse_sgd",
    "tinyformer": "transformer",
}
BATCHES = (8, 64)
ELEMENT_TYPES = {"float32": 1, "int64": 7, "bool": 9}
SIDES = (
    ("ort", "run"),
    ("native", "run"),
    ("compiled", "run"),
    ("compiled", "step"),
    ("package", "run"),
    ("package", "step"),
    ("aot", "run"),
    ("aot", "step"),
)
Side = tuple[str, str]  # (the process, its mode: "run" the three calls, "step" module.step)


def side_name(process: str, mode: str) -> str:
    return process if mode == "run" else f"{process}-{mode}"


def write_inputs(fixture: str, folder: Path) -> None:
    """The train inputs at each batch size (the fixture's batches concatenated, cut to the size), as raw files."""
    expected = json.loads((ROOT / "tests" / "fixtures" / fixture / "expected.json").read_text())
    data = np.load(ROOT / "tests" / "fixtures" / fixture / "data.npz")
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for size in BATCHES:
        for k, key in enumerate(expected["data_keys"]["train"]):
            steps = data[key]
            array = np.ascontiguousarray(steps.reshape(-1, *steps.shape[2:])[:size])
            assert array.shape[0] == size, (fixture, key, steps.shape)
            array.tofile(folder / f"b{size}_{k}.bin")
            lines.append(f"{size} {k} {ELEMENT_TYPES[array.dtype.name]} {array.ndim} {' '.join(map(str, array.shape))}")
    (folder / "manifest.txt").write_text("\n".join(lines) + "\n")


def build_native() -> Path:
    """The runtime and the C program over it, built into bench/.cache (the runtime again only where a source is
    newer than it)."""
    flags = packaged_flags(CACHE / "packaged-runtime")
    built = flags.library.stat().st_mtime if flags.library.is_file() else 0.0
    if any(path.stat().st_mtime > built for path in (*SOURCES.iterdir(), *HEADERS.iterdir())):
        flags = build_packaged(CACHE / "packaged-runtime")
    program = CACHE / "packaged_step_loop"
    compiler = shutil.which(os.environ.get("CC", "cc")) or "gcc"
    source = HERE / "packaged_step_loop.c"
    subprocess.run(
        [compiler, "-std=c11", "-O2", *flags.cflags, str(source), "-o", str(program), *flags.libs], check=True
    )
    return program


class Worker:
    """One side's process: started, its ``ready`` line read, then driven line by line."""

    def __init__(self, command: list[str]) -> None:
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
        )
        words = self.answer("ready")
        self.ready_s = time.perf_counter() - started
        self.create_s, self.first_step_s, self.libpython = float(words[0]), float(words[1]), int(words[2])

    def answer(self, expected: str) -> list[str]:
        line = self.process.stdout.readline() if self.process.stdout else ""
        words = line.split()
        if not words or words[0] != expected:
            self.process.kill()
            raise RuntimeError(f"{self.process.args}: expected '{expected} ...', got {line!r}")
        return words[1:]

    def block(self, mode: str, batch: int, calls: int) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{mode} {batch} {calls}\n")
        self.process.stdin.flush()
        return float(self.answer("us")[0])

    def quit(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        peak = int(self.answer("peak_kb")[0])
        self.process.wait()
        return peak


def measure(model: str, programs: dict[str, Path], sides: tuple[Side, ...], arguments: argparse.Namespace) -> dict:
    """One model's blocks, peaks and start-up figures; ``programs``: the C programs by process name."""
    from ort_torch_train.training.package.build import TRAIN_PROGRAM, build_package
    from ort_torch_train.training.package.manifest import FORMAT

    fixture = FIXTURES[model]
    artifacts = ROOT / "tests" / "fixtures" / fixture / "artifacts"
    package = CACHE / "tiny-packages" / fixture
    manifest = package / "manifest.json"
    stale = (  # none, built before, or holding program archives (before program folders)
        not manifest.is_file()
        or json.loads(manifest.read_text()).get("format") != FORMAT
        or not (package / TRAIN_PROGRAM).is_dir()
    )
    if stale and any(p in ("native", "package", "package-before") for p, _ in sides):
        build_package(artifacts, package)
    inputs = CACHE / "tiny-inputs" / fixture
    write_inputs(fixture, inputs)
    worker = [str(HERE / "tiny_models_worker.py")]
    commands = {
        "ort": [arguments.ort_python, *worker, "ort", str(artifacts), str(inputs)],
        "compiled": [sys.executable, *worker, "compiled", str(artifacts), str(inputs)],
        "package": [sys.executable, *worker, "package", str(artifacts), str(inputs), str(package)],
        "aot": [sys.executable, *worker, "aot", str(artifacts), str(inputs)],
    }
    if arguments.compiled_before:
        commands["compiled-before"] = [str(arguments.compiled_before), *worker, "compiled", str(artifacts), str(inputs)]
    if arguments.package_before:
        before = [str(arguments.package_before), *worker, "package", str(artifacts), str(inputs), str(package)]
        commands["package-before"] = before
    for name, program in programs.items():
        before = name == "native-before" and arguments.native_before_packages is not None
        held = arguments.native_before_packages / fixture if before else package
        commands[name] = [str(program), str(held), str(artifacts / "checkpoint"), str(inputs)]
    rounds, block_seconds = arguments.rounds, arguments.block_seconds
    workers = {name: Worker(commands[name]) for name in dict.fromkeys(process for process, _ in sides)}
    try:
        calls = {}
        for batch in BATCHES:
            for process, mode in sides:  # warm up: compiles the compiled sides' graphs for the size
                workers[process].block(mode, batch, 20)
            ort_us = workers["ort"].block("run", batch, 50)
            calls[batch] = int(min(3000, max(20, block_seconds / (ort_us * 1e-6))))
        blocks: dict[str, dict[int, list[float]]] = {side_name(*s): {b: [] for b in BATCHES} for s in sides}
        for round_index in range(rounds):
            order = sides[round_index % len(sides) :] + sides[: round_index % len(sides)]
            for batch in BATCHES:
                for process, mode in order:
                    blocks[side_name(process, mode)][batch].append(workers[process].block(mode, batch, calls[batch]))
        peaks = {name: worker.quit() for name, worker in workers.items()}
    finally:
        for worker in workers.values():
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()
    return {
        "fixture": fixture,
        "calls": calls,
        "blocks": blocks,
        "peak_kb": peaks,
        "start": {
            name: {
                "ready_s": w.ready_s,
                "create_s": w.create_s,
                "first_step_s": w.first_step_s,
                "libpython": w.libpython,
            }
            for name, w in workers.items()
        },
    }


def report(results: dict[str, dict], load: tuple[float, float], command: str) -> str:
    sides = list(next(iter(results.values()))["blocks"])
    processes = list(next(iter(results.values()))["peak_kb"])
    lines = [
        "# The corpus models' train step against ORT 1.19.2 (issue 51, item 4)",
        "",
        f"`{command}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())};",
        f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end (2 cores shared with other sessions);",
        "one thread per side; median of the blocks, microseconds per step (TrainStep + OptimizerStep + LazyResetGrad).",
        "",
        "| model | batch | " + " | ".join(sides) + " | " + " | ".join(f"{s} / ORT" for s in sides[1:]) + " |",
        "|---|---:|" + "---:|" * (2 * len(sides) - 1),
    ]
    for model, result in results.items():
        for batch in BATCHES:
            medians = {side: statistics.median(result["blocks"][side][batch]) for side in sides}
            ort = medians["ort"]
            cells = [f"{medians[s]:.1f}" for s in sides] + [f"{medians[s] / ort:.2f}x" for s in sides[1:]]
            lines.append(f"| {model} | {batch} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Peak resident memory (VmHWM, MiB) of each process after both batches, with its ratio to ORT's; then the",
        "checkpoint load, session (module and optimizer) creation and one step at batch 8, in seconds, timed inside",
        "the process (imports before the clock); the libpython lines of the native process's /proc/self/maps:",
        "",
        "| model | "
        + " | ".join(f"{p} RSS" for p in processes)
        + " | "
        + " | ".join(f"{p} / ORT" for p in processes[1:]),
    ]
    lines[-1] += " | " + " | ".join(f"{p} create+first" for p in processes) + " | libpython |"
    lines.append("|---|" + "---:|" * (3 * len(processes)))
    for model, result in results.items():
        peak = {name: kb / 1024 for name, kb in result["peak_kb"].items()}
        start = {name: s["create_s"] + s["first_step_s"] for name, s in result["start"].items()}
        cells = [f"{peak[p]:.0f}" for p in processes] + [f"{peak[p] / peak['ort']:.2f}x" for p in processes[1:]]
        cells += [f"{start[p]:.3f}" for p in processes]
        cells.append(str(result["start"].get("native", {}).get("libpython", "-")))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(FIXTURES), default=list(FIXTURES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.05)
    parser.add_argument("--ort-python", default=str(ROOT / ".venv-ort" / "bin" / "python"))
    parser.add_argument("--out", type=Path, help="OUT.md and OUT.json (default bench/results/STAMP-tiny-models-vs-ort)")
    parser.add_argument("--sides", nargs="+", choices=[side_name(*s) for s in SIDES], help="default: all (ort first)")
    parser.add_argument(
        "--native-before",
        type=Path,
        help="also time this packaged_step_loop (built against another runtime) as native-before",
    )
    parser.add_argument(
        "--compiled-before",
        type=Path,
        help="also time module.step in this interpreter (a venv of another checkout) as compiled-before-step",
    )
    parser.add_argument(
        "--package-before",
        type=Path,
        help="also time the package side in this interpreter (a venv of another checkout) as package-before",
    )
    parser.add_argument(
        "--native-before-packages",
        type=Path,
        help="native-before trains the packages in this folder (one per fixture, by its name), not this build's",
    )
    args = parser.parse_args(argv)
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-tiny-models-vs-ort", time.gmtime())
    sides = tuple(s for s in SIDES if args.sides is None or s[0] == "ort" or side_name(*s) in args.sides)
    programs = {"native": build_native()} if ("native", "run") in sides else {}
    if args.compiled_before:
        sides += (("compiled-before", "step"),)
    if args.package_before:
        sides += (("package-before", "run"),)
    if args.native_before:
        programs["native-before"] = args.native_before
        sides += (("native-before", "run"),)
    load_start = os.getloadavg()[0]
    command = " ".join([".venv/bin/python bench/experiments/tiny_models_vs_ort.py", *(argv or sys.argv[1:])])
    results: dict[str, dict] = {}
    for model in args.models:  # the files rewritten after each model: a cut-short run keeps what it measured
        results[model] = measure(model, {p: programs[p] for p, _ in sides if p in programs}, sides, args)
        load = (load_start, os.getloadavg()[0])
        text = report(results, load, command)
        Path(f"{out}.md").write_text(text)
        Path(f"{out}.json").write_text(json.dumps({"load_average": load, "results": results}, indent=1) + "\n")
    print(text)
    return results


if __name__ == "__main__":
    main()
