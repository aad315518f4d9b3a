"""Compile time of a fresh process, cold and with the compile caches of an earlier one.

    python bench/compile_cache.py [--model tinyformer] [--threads 2]

Four processes, one after another, each timing ``Module(compile=True)`` + its first three steps, then
the eval graph's first call (``module.eval(); module(x, y)``) on its own:
cold (an empty inductor cache dir, ``load_compile_cache`` finding no file; then ``save_compile_cache``),
portable (a new empty cache dir, ``load_compile_cache`` of that file first), local (the first one's
cache dir again, no file) and second (the first one's cache dir and its file: a second process on the
same machine). ``--stages`` adds torch._dynamo.utils.compile_times() of each process.
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

BENCH = Path(__file__).resolve().parent


def child(artifacts: Path, cache_file: Path, mode: str, threads: int) -> dict:
    import numpy as np
    import torch

    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.training.compile_cache import load_compile_cache, save_compile_cache

    torch.set_num_threads(threads)
    started = time.perf_counter()
    loaded = load_compile_cache(cache_file) if mode != "local" else False  # cold: no file yet, precompiles
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", compile=True)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    x, y = np.load(artifacts / "x.npy"), np.load(artifacts / "y.npy")
    module.train()
    for _ in range(3):  # the first step compiles (adding and overwriting gradients share one graph)
        module.step(optimizer, x, y)
        module.lazy_reset_grad()
    compile_s = time.perf_counter() - started
    module.eval()
    eval_started = time.perf_counter()
    module(x, y)
    eval_s = time.perf_counter() - eval_started
    module.train()
    step_ms = []
    for _ in range(20):
        step_started = time.perf_counter()
        module.step(optimizer, x, y)
        step_ms.append((time.perf_counter() - step_started) * 1e3)
    result = {"mode": mode, "compile_s": compile_s, "eval_s": eval_s, "next_step_ms": float(np.median(step_ms)), "loaded": loaded,
              "stages": torch._dynamo.utils.compile_times(repr="str", aggregate=True)}
    if mode == "cold":
        result["saved_bytes"] = save_compile_cache(cache_file)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tinyformer")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stages", action="store_true", help="print where each process spent its compile time")
    parser.add_argument("--child", nargs=3, metavar=("ARTIFACTS", "CACHE_FILE", "MODE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]), args.child[2], args.threads)))
        return 0

    sys.path.insert(0, str(BENCH))
    from artifacts import prepare_artifacts
    from models import MODELS

    artifacts = prepare_artifacts(MODELS[args.model], BENCH / ".cache", use_ort=False).directory
    with tempfile.TemporaryDirectory() as scratch:
        cache_file, first_dir = Path(scratch) / "compile.cache", Path(scratch) / "inductor-a"
        results = []
        for mode, cache_dir in (("cold", first_dir), ("portable", Path(scratch) / "inductor-b"), ("local", first_dir),
                                ("second", first_dir)):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
            command = [sys.executable, __file__, "--threads", str(args.threads),
                       "--child", str(artifacts), str(cache_file), mode]
            output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(output.strip().splitlines()[-1]))
    cold, cold_eval = results[0]["compile_s"], results[0]["eval_s"]
    print(f"model {args.model}, {args.threads} threads: Module(compile=True) + 3 module.step, then the eval graph's "
          f"first call, fresh process")
    for result in results:
        print(f"  {result['mode']:>8}: {result['compile_s']:7.2f} s  ({result['compile_s'] / cold:.1%} of cold)"
              f"  eval {result['eval_s']:5.2f} s  ({result['eval_s'] / cold_eval:.1%})"
              f"  then a step {result['next_step_ms']:.2f} ms (median of 20)" + (f"  saved {result['saved_bytes']} bytes"
                                                                  if "saved_bytes" in result else ""))
        if args.stages:
            print("    " + result["stages"].replace("\n", "\n    "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
