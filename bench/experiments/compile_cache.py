"""Compile time of a fresh process, cold and with the compile caches of an earlier one.

    python bench/experiments/compile_cache.py [--model tinyformer] [--threads 2] [--ranks 1]
    python bench/experiments/compile_cache.py --cli tests/fixtures/cnn [--threads 2]

Four processes, one after another, each timing ``Module(compile=True)`` + its first three steps, then
the eval graph's first call (``module.eval(); module(x, y)``) on its own:
cold (an empty inductor cache dir and an empty compile cache dir, which it fills), new-container (a new
empty inductor cache dir, the filled compile cache), local (the first one's inductor cache dir, no
compile cache: inductor's own caches) and second (the first one's inductor cache dir and the compile
cache: a second process on the same machine). ``--stages`` adds torch._dynamo.utils.compile_times() of
each process. ``--ranks 2`` runs each of them as two data-parallel ranks (gloo,
``Module(distributed=True)``, half the batch each, ``--threads`` each; rank 0 reports).

``--cli CASE`` runs ``ort-torch-train train CASE/artifacts --compile --json`` on the case's batched
``data.npz`` three times with one new inductor cache dir: first (an empty ``--compile-cache``), second
(the same, filled: its ``compile_seconds`` should be at most 10% of the first's) and without the
compile cache (``--no-compile-cache``: inductor's caches alone), and prints each ``compile_seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))


def child(artifacts: Path, cache_dir: Path, mode: str, threads: int) -> dict:
    import numpy as np
    import torch

    from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads

    set_threads(threads)  # pinned: the library's default follows the load
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        torch.distributed.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0"))
    started = time.perf_counter()
    loaded = mode != "local" and cache_dir.is_dir()
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(
        artifacts / "training_model.onnx",
        state,
        artifacts / "eval_model.onnx",
        compile=True,
        distributed=world_size > 1,
        compile_cache=cache_dir if mode != "local" else False,
    )
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    x, y = np.load(artifacts / "x.npy"), np.load(artifacts / "y.npy")
    share = len(x) // world_size
    x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
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
    result = {
        "mode": mode,
        "compile_s": compile_s,
        "eval_s": eval_s,
        "next_step_ms": float(np.median(step_ms)),
        "loaded": loaded,
        "stages": torch._dynamo.utils.compile_times(repr="str", aggregate=True),
    }
    if mode == "cold" and rank == 0:
        result["saved_bytes"] = sum(path.stat().st_size for path in cache_dir.rglob("*") if path.is_file())
    if world_size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return result


def run_process(artifacts: Path, cache: Path, mode: str, inductor_dir: Path, threads: int, ranks: int) -> dict:
    """One fresh process (or ``ranks`` of them, torchrun's environment) in ``mode``; rank 0's report."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, __file__, "--threads", str(threads), "--child", str(artifacts), str(cache), mode]
    procs = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir),
                "RANK": str(rank),
                "WORLD_SIZE": str(ranks),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for rank in range(ranks)
    ]
    outputs = [proc.communicate() for proc in procs]
    for proc, (_, stderr) in zip(procs, outputs):
        if proc.returncode:
            raise RuntimeError(f"{mode}: a process failed:\n{stderr[-3000:]}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def cli_runs(case: Path, threads: int) -> int:
    """The CLI's compile_seconds in three runs on ``case`` (one new inductor cache dir): first, second, uncached."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(Path(scratch) / "inductor"),
            "OMP_NUM_THREADS": str(threads),
        }
        data = case / "data.npz"
        common = ["train", str(case / "artifacts"), "--data", str(data), "--inputs", "x_train,y_train", "--batched"]
        common += ["--steps", "5", "--eval-data", str(data), "--eval-inputs", "x_eval,y_eval", "--compile", "--json"]
        seconds = {}
        for run, cache in (
            ("first", ["--compile-cache", str(Path(scratch) / "cache")]),
            ("second", ["--compile-cache", str(Path(scratch) / "cache")]),
            ("no compile cache", ["--no-compile-cache"]),
        ):
            command = [sys.executable, "-m", "ort_torch_train", *common, *cache, "--output", f"{scratch}/{run}"]
            started = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            wall = time.perf_counter() - started
            seconds[run] = json.loads(done.stdout)["compile_seconds"]
            print(f"  {run:>16}: compile_seconds {seconds[run]:7.2f}  (process {wall:6.2f} s)")
        print(f"second / first: {seconds['second'] / seconds['first']:.1%} (the goal: at most 10%)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tinyformer")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=1, help="data-parallel ranks per process launch (gloo)")
    parser.add_argument("--stages", action="store_true", help="print where each process spent its compile time")
    parser.add_argument("--cli", type=Path, metavar="CASE", help="time three CLI runs on this ORT case instead")
    parser.add_argument("--child", nargs=3, metavar=("ARTIFACTS", "CACHE_DIR", "MODE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]), args.child[2], args.threads)))
        return 0
    if args.cli:
        return cli_runs(args.cli, args.threads)

    from model_artifacts import prepare_artifacts
    from models import MODELS

    artifacts = prepare_artifacts(MODELS[args.model], BENCH / ".cache", use_ort=False).directory
    with tempfile.TemporaryDirectory() as scratch:
        cache, first_dir = Path(scratch) / "compile_cache", Path(scratch) / "inductor-a"
        results = []
        for mode, inductor_dir in (
            ("cold", first_dir),
            ("new-container", Path(scratch) / "inductor-b"),
            ("local", first_dir),
            ("second", first_dir),
        ):
            results.append(run_process(artifacts, cache, mode, inductor_dir, args.threads, args.ranks))
    cold, cold_eval = results[0]["compile_s"], results[0]["eval_s"]
    ranks = "" if args.ranks == 1 else f" x {args.ranks} data-parallel ranks"
    print(
        f"model {args.model}, {args.threads} threads{ranks}: Module(compile=True) + 3 module.step, then the eval "
        f"graph's first call, fresh process"
    )
    for result in results:
        print(
            f"  {result['mode']:>13}: {result['compile_s']:7.2f} s  ({result['compile_s'] / cold:.1%} of cold)"
            f"  eval {result['eval_s']:5.2f} s  ({result['eval_s'] / cold_eval:.1%})"
            f"  then a step {result['next_step_ms']:.2f} ms (median of 20)"
            + (f"  saved {result['saved_bytes']} bytes" if "saved_bytes" in result else "")
        )
        if args.stages:
            print("    " + result["stages"].replace("\n", "\n    "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
