"""A fresh process's first training step: a package of steps (``ort-torch-train package``) loaded, against ONNX
Runtime 1.19.2's session creation, on the same artifacts (the mlp_ce_adamw_sched fixture, batch 8).

    .venv/bin/python bench/experiments/packaged_first_step.py [--rounds 5] [--ort-python .venv-ort/bin/python]
        [--out FILE.json]

Builds the package once into bench/.cache/package-mlp (not timed) and the C++ program tests/native/packaged_steps.cpp
(libtorch alone). Each round then starts, in turn, a fresh process for:

- ``ort``: ORT 1.19.2's Python API: import onnxruntime.training, CheckpointState, Module, Optimizer, one step
  (``module(x, y)``, ``optimizer.step()``, ``module.lazy_reset_grad()``);
- ``package``: the same program on this project's API with ``Module(..., compile="package:DIR")``;
- ``eager``: the same program, eager steps (no package);
- ``native``: the C++ program: the package loaded by libtorch's loader, one train and optimizer step, no Python.

Reported per side: the median over the rounds of the process's whole wall time (parent-measured: interpreter start
and imports included) and, for the Python sides, of the import, the creation (checkpoint, module, optimizer) and
the first step, each timed inside the process. The ratios are each side's median wall time over ORT's.
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
import torch

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "fixtures" / "mlp_ce_adamw_sched" / "artifacts"
CACHE = ROOT / "bench" / ".cache"

PYTHON_SIDE = """
import json, sys, time
started = time.perf_counter()
import numpy as np
{imports}
imported = time.perf_counter()
folder = {artifacts!r}
state = CheckpointState.load_checkpoint(folder + "/checkpoint")
module = Module(folder + "/training_model.onnx", state, folder + "/eval_model.onnx"{module_arguments})
optimizer = Optimizer(folder + "/optimizer_model.onnx", module)
created = time.perf_counter()
x = ((np.arange(160) * 37 % 17) / np.float32(17.0) - np.float32(0.5)).astype(np.float32).reshape(8, 20)
y = (np.arange(8) % 5).astype(np.int64)
loss = module(x, y)
optimizer.step()
module.lazy_reset_grad()
stepped = time.perf_counter()
print(json.dumps({{"import": imported - started, "create": created - imported, "first_step": stepped - created,
                  "loss": float(np.asarray(loss).reshape(-1)[0])}}))
"""
ORT_IMPORTS = "from onnxruntime.training.api import CheckpointState, Module, Optimizer"
OURS_IMPORTS = "from ort_torch_train.api import CheckpointState, Module, Optimizer"


def _record(tensor: torch.Tensor) -> bytes:
    names = {torch.float32: "f32", torch.int64: "i64"}
    header = " ".join([names[tensor.dtype], str(tensor.dim()), *(str(n) for n in tensor.shape)])
    return header.encode() + b"\n" + tensor.contiguous().numpy().tobytes()


def native_run_file(path: Path) -> None:
    """The C++ program's run file for one step of the Python sides' batch (packaged_steps.cpp's format)."""
    from ort_torch_train.optim.float32 import to_float32
    from ort_torch_train.optim.optimizer_model import read_optimizer_model
    from ort_torch_train.state.training_state import TrainingState

    state = TrainingState.load(ARTIFACTS / "checkpoint")
    spec = read_optimizer_model(ARTIFACTS / "optimizer_model.onnx")
    names = [name for name, param in state.params.items() if param.requires_grad]
    moments = spec.algorithm.updated_moments
    records = [f"count {len(names)}\n".encode(), *(_record(state.params[n].detach()) for n in names)]
    records.append(f"count {len(moments)}\n".encode())
    records += [_record(torch.zeros_like(state.params[n])) for _ in moments for n in names]
    x = ((np.arange(160) * 37 % 17) / np.float32(17.0) - np.float32(0.5)).astype(np.float32).reshape(8, 20)
    y = (np.arange(8) % 5).astype(np.int64)
    scalars = spec.algorithm.step_scalars(spec.hyperparameters.with_learning_rate(to_float32(0.001)), 1)
    records += [b"count 1\n", b"count 2\n", _record(torch.from_numpy(x)), _record(torch.from_numpy(y))]
    records.append(_record(torch.tensor(scalars, dtype=torch.float32)))
    path.write_bytes(b"".join(records))


def build_native(out: Path) -> Path:
    """The C++ program, compiled against the torch wheel's libtorch alone."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise SystemExit("no C++ compiler: the native side needs g++ or c++")
    from ort_torch_train.native.packaged_build import libtorch_flags

    compile_flags, link_flags = libtorch_flags()
    source = ROOT / "tests" / "native" / "packaged_steps.cpp"
    program = out / "packaged_steps"
    subprocess.run(
        [compiler, "-std=c++20", "-O2", *compile_flags, str(source), "-o", str(program), *link_flags], check=True
    )
    return program


def timed(command: list[str]) -> tuple[float, dict]:
    """The process's wall time and the JSON its last line printed (empty for none)."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return wall, (json.loads(last) if last.startswith("{") else {"output": done.stdout.splitlines()[:2]})


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ort-python", default=str(ROOT / ".venv-ort" / "bin" / "python"))
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)

    from ort_torch_train.training.package.build import build_package

    package = CACHE / "package-mlp"
    if not (package / "manifest.json").is_file():
        build_package(ARTIFACTS, package)
    CACHE.mkdir(parents=True, exist_ok=True)
    program = build_native(CACHE)
    run_file = CACHE / "packaged_first_step.run"
    native_run_file(run_file)
    scripts = {}
    for side, interpreter, imports, arguments in (
        ("ort", args.ort_python, ORT_IMPORTS, ""),
        ("package", sys.executable, OURS_IMPORTS, f", compile={'package:' + str(package)!r}"),
        ("eager", sys.executable, OURS_IMPORTS, ""),
    ):
        script = CACHE / f"first_step_{side}.py"
        script.write_text(PYTHON_SIDE.format(imports=imports, artifacts=str(ARTIFACTS), module_arguments=arguments))
        scripts[side] = [interpreter, str(script)]
    scripts["native"] = [str(program), str(package), str(run_file)]

    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {side: [] for side in scripts}
    for _ in range(args.rounds):
        for side, command in scripts.items():
            wall, inside = timed(command)
            runs[side].append({"wall": wall, **inside})
    load_after = os.getloadavg()[0]

    result = {"rounds": args.rounds, "load_average": [load_before, load_after], "runs": runs, "medians": {}}
    print(f"mlp_ce_adamw_sched, batch 8, {args.rounds} rounds; load average {load_before:.1f} -> {load_after:.1f}")
    ort_wall = statistics.median(run["wall"] for run in runs["ort"])
    for side, side_runs in runs.items():
        medians = {
            key: statistics.median(run[key] for run in side_runs)
            for key in ("wall", "import", "create", "first_step")
            if key in side_runs[0]
        }
        result["medians"][side] = medians
        parts = "  ".join(f"{key} {value:7.3f} s" for key, value in medians.items())
        print(f"  {side:8s} {parts}   wall / ORT's {medians['wall'] / ort_wall:5.2f}x")
    print("  native:", runs["native"][0].get("output"))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
