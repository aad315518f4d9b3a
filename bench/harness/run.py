"""Benchmark a full training step: this project vs. hand-written eager PyTorch vs. onnxruntime-training 1.19.2.

    .venv/bin/python bench/harness/run.py [--models mlp cnn tinyformer encoder | gpt128 tiny-llama ...] [--compile] [--configs ...]
                                  [--steps N] [--rounds R] [--warmup W] [--threads T] [--quick] [--no-ort]
    .venv/bin/python bench/harness/run.py --profile MODEL [--profile-config ours|ours-compile] [--profile-steps N]

Each model is trained by (a) ort_torch_train eager, (b) ort_torch_train compile=True, its one-graph
``Module.step`` (e) and that with inductor's Python wrapper instead of the C++ one (g) (--compile), (c) the same model in eager
PyTorch with fused AdamW and (f) that model through torch.compile (--compile), (d) onnxruntime-training
on ORT's own artifacts;
each in its own process, timed in interleaved rounds. Prints the table and writes it as JSON and
Markdown under bench/results/.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch
from model_artifacts import ArtifactSet, prepare_artifacts
from models import DEFAULT_MODELS, MODELS
from orchestrate import ConfigResult, Settings, run_model
from report import HEADERS, LABELS, run_header, table_rows, write_results
from runners import PRECISIONS
from timing import render_table

BENCH = Path(__file__).resolve().parents[1]
NO_ORT_ON_CUDA = (
    "onnxruntime-training's CUDA build is not installable here (only onnxruntime-training-cpu "
    "1.19.2); ORT is timed on CPU only"
)
NO_ORT_MIXED_PRECISION = "onnxruntime-training's CPU build trains float32 only: not timed with --mixed-precision"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(DEFAULT_MODELS))
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time (b), (e), (f) and (g) (inductor compiles each model first: seconds to minutes)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] ((d) is CPU-only: n/a on cuda)")
    parser.add_argument("--steps", type=int, help="timed steps per round (default: per model)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, help="untimed steps first (default: per model)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every configuration")
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(LABELS),
        help="only these configurations (default: all that the other options select)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 steps, 1 round, 2 warmup steps")
    parser.add_argument("--no-ort", action="store_true", help="use this project's generator and skip ORT")
    parser.add_argument(
        "--mixed-precision",
        choices=sorted(PRECISIONS),
        help="autocast dtype of every torch configuration (ORT is then not timed)",
    )
    parser.add_argument(
        "--torch-inputs",
        action="store_true",
        help="feed (a) and (b) torch tensors instead of the numpy arrays ORT gets",
    )
    parser.add_argument(
        "--profile",
        choices=list(MODELS),
        metavar="MODEL",
        help="print torch.profiler tables for (a) vs (c) instead of benchmarking",
    )
    parser.add_argument(
        "--profile-config",
        choices=["ours", "ours-compile", "ours-step", "ours-step-py"],
        default="ours",
        help="profile (a) (default) or (b)",
    )
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="where the JSON/Markdown go")
    parser.add_argument("--cache", type=Path, default=BENCH / ".cache", help="artifact cache")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = args.steps or 5
        args.rounds, args.warmup = 1, args.warmup if args.warmup is not None else 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    return args


def benchmark(args: argparse.Namespace, command: str) -> int:
    """Run every model, print the table, write the result files."""
    settings = Settings(
        args.threads, args.device, args.rounds, args.steps, args.warmup, args.torch_inputs, args.mixed_precision
    )
    cuda = args.device.startswith("cuda")
    header = run_header(command, settings, {m: MODELS[m] for m in args.models}, torch_inputs=args.torch_inputs or cuda)
    results: list[ConfigResult] = []
    notes: list[str] = []
    log_dir = args.cache / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        model = MODELS[name]
        artifacts = prepare_artifacts(model, args.cache, use_ort=not args.no_ort)
        print(f"{name}: artifacts by {artifacts.generator} ({artifacts.directory})", flush=True)
        ort_missing = ort_missing_reason(artifacts, cuda, args.mixed_precision)
        compiled = (
            ["ours-compile", "ours-step", "ours-step-py"] + (["ours-step-graphs"] if cuda else [])
            if args.compile
            else []
        )
        configs = (
            ["ours", *compiled, "torch"]
            + (["torch-compile"] if args.compile else [])
            + ([] if ort_missing else ["ort"])
        )
        configs = [c for c in configs if args.configs is None or c in args.configs]
        results += run_model(
            model, artifacts, configs, settings, log_dir, progress=lambda text: print(text, flush=True)
        )
        if ort_missing:
            results.append(ConfigResult(name, "ort", error=ort_missing))
        notes += model_notes(name, artifacts.generator, [r for r in results if r.model == name])
    header["machine"]["load_average_at_end"] = list(os.getloadavg())
    if not args.compile:
        notes.append("(b), (e), (f) and (g) not run: pass --compile")
    if cuda or args.torch_inputs:
        notes.append("all but (d) are fed torch tensors on the device, (d) numpy arrays")
    else:
        notes.append(
            "(a), (b), (e), (g) and (d) are fed the same numpy arrays (the ORT API), (c) and (f) torch tensors"
        )
    print()
    print(render_table(HEADERS, table_rows(results), left=2))
    for note in notes:
        print(f"- {note}")
    json_path, md_path = write_results(args.out, results, header, notes)
    print(f"\nresults: {json_path}\n         {md_path}")
    return 1 if any(r.error and r.config != "ort" for r in results) else 0


def ort_missing_reason(artifacts: ArtifactSet, cuda: bool, precision: str | None) -> str | None:
    """Why ORT cannot be timed against this run (CUDA, mixed precision, no ORT artifacts), or None."""
    return NO_ORT_ON_CUDA if cuda else NO_ORT_MIXED_PRECISION if precision else artifacts.ort_missing


def model_notes(name: str, generator: str, results: list[ConfigResult]) -> list[str]:
    """Where the artifacts came from, failures, the final losses (all start from the same weights) and
    the attention ops and kernels each configuration ran (where it ran any)."""
    notes = [f"{name}: artifacts made by {generator} generate_artifacts"]
    notes += [f"{name} / {r.config}: {r.error}" for r in results if r.error]
    notes += [
        f"{name} / {r.config}: attention ran as {', '.join(r.attention_kernels)}"
        for r in results
        if r.attention_kernels
    ]
    losses = {r.config: r.last_loss for r in results if r.last_loss is not None}
    if losses:
        notes.append(
            f"{name}: last loss (same weights, batch and step count): "
            + ", ".join(f"{config} {loss:.5g}" for config, loss in losses.items())
        )
    return notes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    python = os.path.relpath(sys.executable) if Path(sys.executable).is_relative_to(Path.cwd()) else sys.executable
    command = shlex.join([python, "bench/harness/run.py", *(sys.argv[1:] if argv is None else argv)])
    if args.profile:
        from profiling import profile_model

        model = MODELS[args.profile]
        artifacts = prepare_artifacts(model, args.cache, use_ort=not args.no_ort)
        profile_model(
            model,
            artifacts,
            threads=args.threads,
            device=args.device,
            steps=args.profile_steps,
            config=args.profile_config,
            torch_inputs=args.torch_inputs,
        )
        return 0
    return benchmark(args, command)


if __name__ == "__main__":
    sys.exit(main())
