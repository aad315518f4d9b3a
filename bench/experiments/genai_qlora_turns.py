"""fp32 and int4 LoRA steps of one ``genai_qlora.py`` model in turns: the step-time ratio on a shared machine.

Runs ``genai_qlora.py run`` for fp32, then int4, then fp32 again ..., each in its own process with the
same threads, batch and tokens, so that both precisions meet the machine's load of the same minutes.
Per round: each precision's median wall time of the steps after the first, the CPU seconds the process
spent in them, the cores it got (CPU seconds per wall second, at most ``--threads``) and the 1-minute
load average; the round's int4/fp32 wall and CPU ratios; then the median of the rounds' ratios. Every
finished process is appended to ``--json`` at once, so a run stopped early keeps its rounds.

    python bench/experiments/genai_qlora_turns.py bench/.cache/genai_qlora_1b --rounds 2 --steps 2 \\
        --batch 1 --tokens 256 --json bench/results/NAME.json

(the directory is ``genai_qlora.py``'s ``--out``, prepared by its ``all`` or ``prepare``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

from memory import in_own_process  # noqa: E402

PRECISIONS = ("fp32", "int4")
SCRIPT = str(Path(__file__).resolve().parent / "genai_qlora.py")


def in_turns(
    directory: Path, rounds: int, steps: int, threads: int, batch: int, tokens: int, kind: str, out: Path | None
) -> list[dict]:
    """Each round's fp32 and int4 ``run`` results, in the order they ran."""
    results: list[dict] = []
    for number in range(rounds):
        for precision in PRECISIONS:
            arguments = ["run", str(directory), "--precision", precision, "--artifacts", kind, "--steps", str(steps)]
            arguments += ["--threads", str(threads), "--batch", str(batch), "--tokens", str(tokens)]
            results.append({"round": number, **in_own_process(SCRIPT, *arguments)})
            if out is not None:
                out.write_text(json.dumps(results, indent=2))
            print(row(results[-1]), flush=True)
    return results


def row(result: dict) -> str:
    cpu = statistics.median(result["step_cpu_s"])
    load = "-".join(f"{value:.1f}" for value in result["load_average_1min"])
    return (
        f"| {result['round'] + 1} | {result['precision']} | {result['median_step_s']:.1f} | {cpu:.2f} "
        f"| {result['cores_used_in_steps']:.2f} | {load} | {result['peak_rss_steps_mib']:.0f} |"
    )


def ratios(results: list[dict]) -> list[dict]:
    """int4 / fp32 per complete round: wall time and CPU time of the median later step."""
    by_round: dict[int, dict[str, dict]] = {}
    for result in results:
        by_round.setdefault(result["round"], {})[result["precision"]] = result
    complete = [pair for _, pair in sorted(by_round.items()) if set(pair) == set(PRECISIONS)]
    return [
        {
            "wall": pair["int4"]["median_step_s"] / pair["fp32"]["median_step_s"],
            "cpu": statistics.median(pair["int4"]["step_cpu_s"]) / statistics.median(pair["fp32"]["step_cpu_s"]),
            "peak_rss_steps": pair["int4"]["peak_rss_steps_mib"] / pair["fp32"]["peak_rss_steps_mib"],
        }
        for pair in complete
    ]


def summary(results: list[dict]) -> str:
    lines = [
        "| round | precision | median later step (wall s) | its CPU (s) | cores used | load avg (before-after) "
        "| peak RSS in steps (MiB) |",
        "|---|---|---:|---:|---:|---|---:|",
        *(row(result) for result in results),
        "",
        "| round | int4 / fp32 wall | int4 / fp32 CPU | int4 / fp32 peak RSS |",
        "|---|---:|---:|---:|",
    ]
    per_round = ratios(results)
    lines += [
        f"| {n + 1} | {r['wall']:.2f}x | {r['cpu']:.2f}x | {r['peak_rss_steps']:.2f}x |"
        for n, r in enumerate(per_round)
    ]
    if per_round:
        medians = [statistics.median(r[key] for r in per_round) for key in ("wall", "cpu", "peak_rss_steps")]
        lines.append("| median | " + " | ".join(f"{value:.2f}x" for value in medians) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="steps timed after the first, per process")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--artifacts", choices=("plain", "frozen"), default="plain")
    parser.add_argument("--json", type=Path, help="every finished process's result, rewritten after each")
    args = parser.parse_args(argv)
    results = in_turns(
        args.directory, args.rounds, args.steps, args.threads, args.batch, args.tokens, args.artifacts, args.json
    )
    print(summary(results))
    return results


if __name__ == "__main__":
    main()
