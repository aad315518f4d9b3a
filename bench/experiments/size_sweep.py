"""Step time against model size: the same GPT-style decoder at several hidden sizes, five ways, one run.

    .venv/bin/python bench/experiments/size_sweep.py [--sizes 32 128 512] [--device cpu|cuda] [--threads 2]
                                         [--rounds 5] [--quick] [--no-ort] [--plot PATH] [--mixed-precision bf16]

Each size (``gpt<hidden>`` in models.py: 2 pre-LN layers, 4 heads, causal SDPA, GELU MLP, LM loss on
8 x 32 tokens) is trained by this project eager (a) and as one compiled step (``module.step``,
``compile=True``) (e), by the hand-written model in eager PyTorch (c) and through ``torch.compile`` (f),
and by onnxruntime-training 1.19.2 (d), each in its own process, timed in interleaved rounds (as
``run.py``). On CUDA the one-graph step also runs with ``compile="reduce-overhead"`` (CUDA graphs) (h), ORT
is not timed (its training build is CPU-only here), and the notes name the attention kernels each
configuration launched (flash attention needs ``--mixed-precision bf16``: its kernels take 16-bit
inputs). Prints the table, writes it under bench/results/ (JSON and Markdown) and plots step time and
the ratio to ORT (without ORT: to (f)) against hidden size as a PNG (needs matplotlib: ``pip install -e .[bench]``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))

from model_artifacts import prepare_artifacts  # noqa: E402
from models import DECODER_SIZES, MODELS  # noqa: E402
from orchestrate import ConfigResult, Settings, run_model  # noqa: E402
from report import HEADERS, LABELS, run_header, table_rows, write_results  # noqa: E402
from run import model_notes, ort_missing_reason  # noqa: E402
from runners import PRECISIONS  # noqa: E402
from timing import render_table  # noqa: E402

CONFIGS = ["ours", "ours-step", "ours-step-graphs", "torch", "torch-compile", "ort"]
CPU_SIZES, CUDA_SIZES = [32, 128, 512], [32, 128, 512, 1024]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        choices=list(DECODER_SIZES),
        help=f"hidden sizes (default {CPU_SIZES} on CPU, {CUDA_SIZES} on CUDA)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] ((d) is CPU-only: n/a on cuda)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every configuration")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, help="timed steps per round (default: per size)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default: per size)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 steps, 1 round, 2 warmup steps")
    parser.add_argument("--no-ort", action="store_true", help="use this project's generator and skip ORT")
    parser.add_argument(
        "--mixed-precision",
        choices=sorted(PRECISIONS),
        help="autocast dtype of every torch configuration (ORT is then not timed)",
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="where the JSON/Markdown/PNG go")
    parser.add_argument("--plot", type=Path, help="the PNG's path (default: next to the results)")
    parser.add_argument("--cache", type=Path, default=BENCH / ".cache", help="artifact cache")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    args.sizes = args.sizes or (CUDA_SIZES if args.device.startswith("cuda") else CPU_SIZES)
    if args.quick:
        args.steps, args.rounds = args.steps or 3, 1
        args.warmup = args.warmup if args.warmup is not None else 2
    return args


def sweep(args: argparse.Namespace, command: str) -> int:
    """Run every size, print the table, write the result files and the plot."""
    settings = Settings(args.threads, args.device, args.rounds, args.steps, args.warmup, precision=args.mixed_precision)
    cuda = args.device.startswith("cuda")
    names = [f"gpt{size}" for size in args.sizes]
    header = run_header(command, settings, {n: MODELS[n] for n in names}, torch_inputs=cuda)
    results: list[ConfigResult] = []
    notes: list[str] = []
    log_dir = args.cache / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        model = MODELS[name]
        artifacts = prepare_artifacts(model, args.cache, use_ort=not args.no_ort)
        print(f"{name}: artifacts by {artifacts.generator}", flush=True)
        ort_missing = ort_missing_reason(artifacts, cuda, args.mixed_precision)
        configs = [c for c in CONFIGS if (c != "ort" or not ort_missing) and (c != "ours-step-graphs" or cuda)]
        results += run_model(model, artifacts, configs, settings, log_dir, progress=lambda t: print(t, flush=True))
        if ort_missing:
            results.append(ConfigResult(name, "ort", error=ort_missing))
        notes += model_notes(name, artifacts.generator, [r for r in results if r.model == name])
    header["machine"]["load_average_at_end"] = list(os.getloadavg())
    notes.append(
        "(a), (e) and (d) are fed numpy arrays (the ORT API), (c) and (f) torch tensors"
        if not cuda
        else "all but (d) are fed torch tensors on the device"
    )
    print()
    print(render_table(HEADERS, table_rows(results), left=2))
    for note in notes:
        print(f"- {note}")
    json_path, md_path = write_results(args.out, results, header, notes)
    plot_path = args.plot or json_path.with_suffix(".png")
    machine = header["machine"]
    device = f"{args.device} ({machine['gpu']})" if "gpu" in machine else args.device
    plotted = plot(
        results,
        args.sizes,
        plot_path,
        f"{machine['cpu']}, {args.threads} thread(s), {device}, "
        f"{args.mixed_precision or 'float32'}, load {machine['load_average_1_5_15'][0]:.1f}",
    )
    print(f"\nresults: {json_path}\n         {md_path}\n         {plotted}")
    return 1 if any(r.error and r.config != "ort" for r in results) else 0


def plot(results: list[ConfigResult], sizes: list[int], path: Path, subtitle: str) -> str:
    """Step time and the ratio to ORT (or to (f) where ORT did not run) against hidden size as a PNG;
    returns its path or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e .[bench])"
    steps = {(r.model, r.config): r.median() for r in results if r.median() is not None and not r.error}
    reference = "ort" if any(config == "ort" for _, config in steps) else "torch-compile"
    figure, (times_axis, ratio_axis) = plt.subplots(1, 2, figsize=(11, 4.5))
    for config in CONFIGS:
        points = [(size, steps[f"gpt{size}", config]) for size in sizes if (f"gpt{size}", config) in steps]
        if points:
            times_axis.plot(*zip(*[(s, t * 1e3) for s, t in points]), marker="o", label=LABELS[config])
        ratios = [(s, t / steps[f"gpt{s}", reference]) for s, t in points if (f"gpt{s}", reference) in steps]
        if ratios and config != reference:
            ratio_axis.plot(*zip(*ratios), marker="o", label=LABELS[config])
    times_axis.set(
        xscale="log", yscale="log", xlabel="hidden size", ylabel="step time (ms, median)", title="training step time"
    )
    ratio_axis.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ratio_axis.set(
        xscale="log",
        yscale="log",
        xlabel="hidden size",
        ylabel=f"step time / {LABELS[reference]} (lower: faster)",
        title=f"ratio to {LABELS[reference]}",
    )
    for axis in (times_axis, ratio_axis):
        axis.set_xticks(sizes, [str(s) for s in sizes])
        axis.minorticks_off()
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"GPT-style decoder, 2 layers, 8 x 32 tokens: {subtitle}", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    python = os.path.relpath(sys.executable) if Path(sys.executable).is_relative_to(Path.cwd()) else sys.executable
    command = shlex.join([python, "bench/experiments/size_sweep.py", *(sys.argv[1:] if argv is None else argv)])
    return sweep(args, command)


if __name__ == "__main__":
    sys.exit(main())
