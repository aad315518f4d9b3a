"""Start-up, step time and memory at GPT-2 small's scale (124M parameters): this project, ORT, hand-written torch.

    .venv/bin/python bench/experiments/scale.py [--configs ours ours-step torch torch-compile ort] [--rounds 3]
                                               [--steps 3] [--threads 2] [--no-ort]

The model is ``gpt2-124m`` (harness/models.py: transformers GPT-2 with GPT-2 small's shape, random
init, LM loss on 2 x 128 tokens). Its artifacts come from ORT 1.19.2's ``generate_artifacts`` where
``.venv-ort`` exists, else from this project's. Each configuration runs in its own process (``run.py``'s
workers, each started once the one before is ready and the others suspended meanwhile, so that
start-ups are timed apart; then interleaved rounds, the others suspended while one is timed) and reports: load (checkpoint
read, conversion and binding; ORT: its session and optimizer), the first step, the steady step (median),
peak RSS once loaded and at the end. Writes the step table under bench/results/ (as ``run.py``) plus a
``-scale.md`` twin with the start-up and memory table.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

from model_artifacts import prepare_artifacts  # noqa: E402
from models import GPT2_SMALL  # noqa: E402
from orchestrate import ConfigResult, Settings, run_model  # noqa: E402
from report import HEADERS, LABELS, run_header, table_rows, write_results  # noqa: E402
from run import model_notes, ort_missing_reason  # noqa: E402
from timing import format_duration, render_table  # noqa: E402

CONFIGS = ["ours", "ours-step", "ours-step-dynamic", "torch", "torch-compile", "ort"]
DEFAULT_CONFIGS = ["ours", "ours-step", "torch", "torch-compile", "ort"]
SCALE_HEADERS = [
    "config",
    "load",
    "first step",
    "steady step",
    "RSS loaded MB",
    "peak RSS MB",
    "vs ORT: load+first",
    "vs ORT: RSS",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=DEFAULT_CONFIGS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, help=f"timed steps per round (default {GPT2_SMALL.steps})")
    parser.add_argument(
        "--warmup", type=int, help=f"untimed steps first, the first one included (default {GPT2_SMALL.warmup})"
    )
    parser.add_argument("--no-ort", action="store_true", help="use this project's generator and skip ORT")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--cache", type=Path, default=BENCH / ".cache")
    return parser.parse_args(argv)


def scale_rows(results: list[ConfigResult]) -> list[list[str]]:
    """One row per configuration: start-up, steps and memory, with ratios to ORT where it ran."""
    ort = next((r for r in results if r.config == "ort" and not r.error), None)
    ort_start = (
        ort.load_s + ort.first_step_s if ort and ort.load_s is not None and ort.first_step_s is not None else None
    )
    rows = []
    for r in results:
        if r.error:
            rows.append([LABELS[r.config], r.error] + [""] * (len(SCALE_HEADERS) - 2))
            continue
        start = (r.load_s or 0.0) + (r.first_step_s or 0.0)
        steady = r.median()
        rows.append(
            [
                LABELS[r.config],
                format_duration(r.load_s) if r.load_s is not None else "n/a",
                format_duration(r.first_step_s) if r.first_step_s is not None else "n/a",
                format_duration(steady) if steady is not None else "n/a",
                f"{r.rss_after_load_mb:.0f}" if r.rss_after_load_mb is not None else "n/a",
                f"{r.peak_memory_mb:.0f}" if r.peak_memory_mb is not None else "n/a",
                f"{start / ort_start:.2f}x" if ort_start else "n/a",
                f"{r.peak_memory_mb / ort.peak_memory_mb:.2f}x"
                if ort and ort.peak_memory_mb and r.peak_memory_mb
                else "n/a",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    python = os.path.relpath(sys.executable) if Path(sys.executable).is_relative_to(Path.cwd()) else sys.executable
    command = shlex.join([python, "bench/experiments/scale.py", *(sys.argv[1:] if argv is None else argv)])
    settings = Settings(args.threads, "cpu", args.rounds, args.steps, args.warmup, sequential_setup=True)
    header = run_header(command, settings, {GPT2_SMALL.name: GPT2_SMALL}, torch_inputs=False)
    log_dir = args.cache / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    artifacts = prepare_artifacts(GPT2_SMALL, args.cache, use_ort=not args.no_ort)
    print(f"{GPT2_SMALL.name}: artifacts by {artifacts.generator}", flush=True)
    ort_missing = ort_missing_reason(artifacts, False, None)
    configs = [c for c in args.configs if c != "ort" or not ort_missing]
    results = run_model(GPT2_SMALL, artifacts, configs, settings, log_dir, progress=lambda t: print(t, flush=True))
    if ort_missing and "ort" in args.configs:
        results.append(ConfigResult(GPT2_SMALL.name, "ort", error=ort_missing))
    notes = model_notes(GPT2_SMALL.name, artifacts.generator, results)
    header["machine"]["load_average_at_end"] = list(os.getloadavg())
    scale_table = render_table(SCALE_HEADERS, scale_rows(results))
    print()
    print(render_table(HEADERS, table_rows(results), left=2))
    print()
    print(scale_table)
    json_path, md_path = write_results(args.out, results, header, notes)
    scale_path = md_path.with_name(md_path.stem + "-scale.md")
    scale_path.write_text(
        f"Command: `{command}`\n\nStart-up and memory (load: checkpoint read, conversion, binding; "
        f"RSS loaded: peak RSS before the first step):\n\n"
        + render_table(SCALE_HEADERS, scale_rows(results), markdown=True)
        + "\n"
    )
    print(f"\nresults: {json_path}\n         {md_path}\n         {scale_path}")
    return 1 if any(r.error and r.config != "ort" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
