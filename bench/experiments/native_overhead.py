"""The C API's step (libort_torch_train, TrainStep + OptimizerStep + LazyResetGrad) against the Python API's
step (``module(x, y); optimizer.step(); module.lazy_reset_grad()``, numpy in) on the same model, in one process.

    .venv/bin/python bench/experiments/native_overhead.py [--blocks 15] [--calls 300] [--threads 1] [--out FILE]

Builds the library into bench/.cache/native, compiles ``native_step.c`` and runs it: blocks of ``--calls``
steps alternate between the C API and the Python API (run by the same embedded interpreter, on its own
session of the same artifacts: the mlp_ce_adamw_sched fixture, batch 8). Reported: each side's lowest and
median block (microseconds per step), the ratio C / Python of the medians and the C API's per-step
overhead (median difference). Target: ratio <= 1.1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from ort_torch_train.native import build
from ort_torch_train.native.build import find_compiler, python_library

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "fixtures" / "mlp_ce_adamw_sched" / "artifacts"

PYTHON_SIDE = """
import time
import numpy as np
from ort_torch_train.api import CheckpointState, Module, Optimizer

_dir = {artifacts!r}
_state = CheckpointState.load_checkpoint(_dir + "/checkpoint")
_module = Module(_dir + "/training_model.onnx", _state)
_optimizer = Optimizer(_dir + "/optimizer_model.onnx", _module)
_x = ((np.arange(160) * 37 % 17) / np.float32(17.0) - np.float32(0.5)).astype(np.float32).reshape(8, 20)
_y = (np.arange(8) % 5).astype(np.int64)


def python_block(calls):
    start = time.perf_counter()
    for _ in range(calls):
        _module(_x, _y)
        _optimizer.step()
        _module.lazy_reset_grad()
    return time.perf_counter() - start
"""


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", default="1", help="ORT_TORCH_TRAIN_THREADS for the run")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)

    flags = build(ROOT / "bench" / ".cache" / "native")
    program = flags.prefix / "bin" / "native_step"
    program.parent.mkdir(exist_ok=True)
    libdir, pylib, _ = python_library()
    command = [find_compiler(), "-std=c11", "-O2", f"-I{sysconfig.get_paths()['include']}", *flags.cflags]
    command += [str(Path(__file__).with_name("native_step.c")), "-o", str(program), *flags.libs]
    command += [f"-L{libdir}", f"-l{pylib}", f"-Wl,-rpath,{libdir}"]
    subprocess.run(command, check=True)

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(PYTHON_SIDE.format(artifacts=str(ARTIFACTS)))
    env = dict(os.environ, ORT_TORCH_TRAIN_THREADS=args.threads)
    run = [str(program), str(ARTIFACTS), script.name, str(args.blocks), str(args.calls)]
    done = subprocess.run(run, capture_output=True, text=True, env=env, check=True)
    os.unlink(script.name)
    blocks: dict[str, list[float]] = {"c": [], "python": []}
    for line in done.stdout.splitlines():
        side, value = line.split()
        blocks[side].append(float(value))
    c_median, python_median = statistics.median(blocks["c"]), statistics.median(blocks["python"])
    result = {
        "command": shlex.join(["bench/experiments/native_overhead.py", *(argv or [])]),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        "threads": args.threads,
        "blocks": args.blocks,
        "calls": args.calls,
        "c_us": {"lowest": min(blocks["c"]), "median": c_median},
        "python_us": {"lowest": min(blocks["python"]), "median": python_median},
        "ratio_of_medians": c_median / python_median,
        "ratio_of_lowest": min(blocks["c"]) / min(blocks["python"]),
        "overhead_us_per_step": c_median - python_median,
        "per_block": blocks,
    }
    print(
        f"mlp_ce_adamw_sched, batch 8, {args.threads} thread(s), {args.blocks} blocks of {args.calls} steps\n"
        f"  C API step       lowest {result['c_us']['lowest']:8.1f} us   median {c_median:8.1f} us\n"
        f"  Python API step  lowest {result['python_us']['lowest']:8.1f} us   median {python_median:8.1f} us\n"
        f"  C / Python: {result['ratio_of_medians']:.3f} (medians), {result['ratio_of_lowest']:.3f} (lowest); "
        f"C API overhead {result['overhead_us_per_step']:+.1f} us per step"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
