"""Train-step time on an idle machine against one with N busy processes, by thread policy.

    .venv/bin/python bench/experiments/contention.py [--models mlp cnn bce regress_mse mlp_frozen gpt2]
        [--competitors 0 1] [--policies default auto one passive] [--steps 30] [--warmup 5] [--compile]
        [--gpt2 768,12,12,8,128] [--out bench/results]

Each (model, policy, competitor count) runs in a fresh process (OpenMP reads its environment when
torch loads it), with N ``python -c "while True: pass"`` processes started before it and stopped
after. Models: the reference corpus's cases (``../shared/refcorpus``: one batch of its training
data) and ``gpt2``, a random-init ``transformers`` GPT-2 of ``--gpt2 hidden,layers,heads,batch,tokens``
(default the 124M shape; the bench harness builds and caches its artifacts). Policies:

    default  torch's thread count, fixed (set_threads(torch.get_num_threads())): the library's former default
    library  no set_threads call: the library's default policy (auto unless OMP_NUM_THREADS is set;
             ORT_TORCH_TRAIN_THREADS is removed from the workers' environment)
    auto     set_threads("auto"): threads follow the cores other processes leave free
    one      set_threads(1)
    passive  auto, with OMP_WAIT_POLICY=PASSIVE (libgomp) and KMP_BLOCKTIME=0 (Intel OpenMP)
    fixed-passive  torch's thread count, fixed, with those two settings

Prints the median step time of each setting, its slowdown against the same policy on the idle
machine, the idle time against ``default`` and the policy in effect at the end
(``threads_setting``); writes the table to ``--out/contention-<time>.json``.
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

import numpy as np
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads
from ort_torch_train.training.threads import THREADS_VARIABLE, threads_setting

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "refcorpus"
HARNESS = ROOT / "bench" / "harness"
sys.path.insert(0, str(HARNESS))

from lm_models import tiny_transformer  # noqa: E402
from model_artifacts import prepare_artifacts  # noqa: E402
from models import BenchModel  # noqa: E402

POLICIES = ("default", "library", "auto", "one", "passive", "fixed-passive")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "bce", "regress_mse", "mlp_frozen", "gpt2"])
    parser.add_argument("--competitors", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--steps", type=int, default=30, help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation included)")
    parser.add_argument("--compile", action="store_true", help="Module(compile=True)")
    parser.add_argument("--gpt2", default="768,12,12,8,128", help="hidden,layers,heads,batch,tokens of 'gpt2'")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / ".cache", help="the gpt2 artifacts' cache")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    rows = []
    for model in args.models:
        for policy in args.policies:
            for competitors in args.competitors:
                setting = {
                    "model": model,
                    "policy": policy,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "compile": args.compile,
                    "gpt2": args.gpt2,
                    "cache": str(args.cache),
                }
                result = _measure(setting, competitors)
                rows.append({**setting, "competitors": competitors, **result})
                print(f"  {model} {policy} {competitors} busy: {result['median_ms']:.2f} ms", file=sys.stderr)
    _print_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"contention-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"cpus": len(os.sched_getaffinity(0)), "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


def _measure(setting: dict, competitors: int) -> dict:
    """One setting in a fresh process, with ``competitors`` busy processes running alongside."""
    unset = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", THREADS_VARIABLE)
    environment = {key: value for key, value in os.environ.items() if key not in unset}
    if setting["policy"] in ("passive", "fixed-passive"):
        environment.update(OMP_WAIT_POLICY="PASSIVE", KMP_BLOCKTIME="0")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(competitors)]
    try:
        time.sleep(0.5 if competitors else 0)
        completed = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(setting)],
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        for process in busy:
            process.kill()
            process.wait()
    if completed.returncode != 0:
        raise SystemExit(f"the worker for {setting} failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _worker(setting: dict) -> dict:
    """Train ``setting``'s model for its warmup and timed steps; the median step time and final thread count."""
    directory, inputs = _model(setting)
    policy = setting["policy"]
    fixed = policy in ("default", "fixed-passive")
    if policy != "library":
        set_threads(torch.get_num_threads() if fixed else 1 if policy == "one" else "auto")
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, compile=setting["compile"])
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    times = []
    for step in range(setting["warmup"] + setting["steps"]):
        started = time.perf_counter()
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        if step >= setting["warmup"]:
            times.append(time.perf_counter() - started)
    return {
        "median_ms": 1000 * statistics.median(times),
        "p90_ms": 1000 * float(np.percentile(times, 90)),
        "threads_at_end": torch.get_num_threads(),
        "threads_setting": str(threads_setting()),
    }


def _model(setting: dict) -> tuple[Path, list]:
    """The artifacts folder and one batch of ``setting``'s model."""
    name = setting["model"]
    if name != "gpt2":
        data = np.load(CORPUS / name / "data.npz")
        return CORPUS / name / "artifacts", [data["x_train"][0], data["y_train"][0]]
    hidden, layers, heads, batch, tokens = (int(value) for value in setting["gpt2"].split(","))
    vocab = 50257
    model = BenchModel(
        f"gpt2-h{hidden}-l{layers}",
        f"transformers gpt2 (random init, hidden {hidden}, {layers} layers, {heads} heads, vocab {vocab})",
        lambda: tiny_transformer("gpt2", vocab=vocab, hidden=hidden, layers=layers, heads=heads, tokens=tokens),
        (tokens,),
        batch,
        vocab,
        steps=setting["steps"],
        warmup=setting["warmup"],
        vocab=vocab,
        language_model=True,
    )
    artifacts = prepare_artifacts(model, Path(setting["cache"]), use_ort=False)
    directory = artifacts.directory
    return directory, [np.load(directory / "x.npy"), np.load(directory / "y.npy")]


def _print_table(rows: list[dict]) -> None:
    idle = {(row["model"], row["policy"]): row["median_ms"] for row in rows if row["competitors"] == 0}
    print(
        f"{'model':<14} {'policy':<8} {'busy':>4} {'ms/step':>9} {'vs idle':>8} {'idle vs default':>16} "
        f"{'threads':>7} {'policy in effect':>16}"
    )
    for row in rows:
        own_idle = idle.get((row["model"], row["policy"]))
        default_idle = idle.get((row["model"], "default"))
        slowdown = f"{row['median_ms'] / own_idle:.2f}x" if own_idle else "-"
        change = (
            f"{100 * (own_idle / default_idle - 1):+.1f}%"
            if own_idle and default_idle and row["competitors"] == 0
            else ""
        )
        print(
            f"{row['model']:<14} {row['policy']:<8} {row['competitors']:>4} {row['median_ms']:>9.2f} "
            f"{slowdown:>8} {change:>16} {row['threads_at_end']:>7} {row['threads_setting']:>16}"
        )


if __name__ == "__main__":
    sys.exit(main())
