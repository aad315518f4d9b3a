"""A package's train program with and without ``passes/small_products.py``: its own per-call cost (issue 51, item 4).

    .venv/bin/python bench/experiments/small_products.py [--models mlp batchnorm ...] [--limits 0 256:stack]
        [--rounds 9] [--calls 300] [--out bench/results/STAMP-small-products]

For each model (tests/fixtures, made by ORT 1.19.2) its train step is exported as ``ort-torch-train package``
exports it (the batch dynamic) and compiled with AOTInductor once per limit (``MAX_STATIC_EXTENTS``; 0: no
product rewritten, the program as built before the pass; suffixes over ``programs.PROGRAM_SETTINGS``: ``:serial``
inductor's ``cpp.threads=1``, ``:unplanned`` ``memory_planning`` off, ``:stack``
``aot_inductor.allow_stack_allocation``), each program loaded by libtorch's
loader (one thread, as the runtime with no Python loads it) and called on the same arguments at batch 8 and 64, in
blocks alternating between the limits, round after round; a block's figure is the process's CPU time per call
(``time.process_time``), the Python call of the loader's ``run`` included, Python's garbage collector off. Before
timing, each program's outputs and updated gradients are compared with the first limit's (the largest difference
is reported).
Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from packaged_build_options import train_program  # noqa: E402  (a sibling experiment)
from tiny_models_vs_ort import BATCHES, FIXTURES  # noqa: E402  (the corpus models, as the comparison with ORT names them)

from ort_torch_train.torch_internals import aoti_package_runner  # noqa: E402
from ort_torch_train.training.package import programs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def arguments_at(example: list[torch.Tensor], inputs: int, batch: int) -> list[torch.Tensor]:
    """Random arguments like ``example`` with the user inputs' first axis ``batch`` (integer inputs kept in range)."""
    generator = torch.Generator().manual_seed(batch)
    arguments = []
    for index, tensor in enumerate(example):
        shape = (batch, *tensor.shape[1:]) if index < inputs and tensor.dim() else tuple(tensor.shape)
        if tensor.is_floating_point():
            arguments.append(torch.rand(shape, generator=generator))
        elif tensor.dtype == torch.bool:
            arguments.append(tensor.clone())
        else:
            arguments.append(torch.zeros(shape, dtype=tensor.dtype))
    return arguments


SUFFIXES = {  # a variant's suffix -> inductor settings over the package's (programs.PROGRAM_SETTINGS)
    "serial": {"cpp.threads": 1},
    "unplanned": {"memory_planning": False},
    "stack": {"aot_inductor.allow_stack_allocation": True},
}


def settings_of(variant: str) -> tuple[int, dict[str, object]]:
    """The limit and the inductor settings of a variant ``LIMIT[:SUFFIX...]``."""
    limit, *suffixes = variant.split(":")
    unknown = [suffix for suffix in suffixes if suffix not in SUFFIXES]
    if unknown:
        raise SystemExit(f"variant {variant!r}: expected suffixes among {sorted(SUFFIXES)}, got {unknown}")
    return int(limit), {key: value for suffix in suffixes for key, value in SUFFIXES[suffix].items()}


def extern_products(path: Path) -> int:
    """How many extern matrix products (``mm``, ``addmm``, ``bmm`` calls) the package file's program makes."""
    with zipfile.ZipFile(path) as archive:
        sources = [archive.read(name).decode() for name in archive.namelist() if name.endswith("wrapper.cpp")]
    return sum(len(re.findall(r"aoti_torch_cpu_(?:add)?b?mm_out\(", source)) for source in sources)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(FIXTURES), default=[m for m in FIXTURES if m != "cnn"])
    parser.add_argument("--limits", nargs="+", default=["0", "256", "1024"])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-small-products", time.gmtime())
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for model in args.models:
            exported, example, inputs = train_program(FIXTURES[model], 8, static=False)
            runners, compile_s, externs = {}, {}, {}
            for limit in args.limits:
                path = Path(scratch) / f"{model}-{len(runners)}"  # a program folder
                started = time.perf_counter()
                max_static_extents, inductor = settings_of(limit)
                programs.compile_program(
                    exported,
                    path,
                    max_static_extents=max_static_extents,
                    settings={**programs.PROGRAM_SETTINGS, **inductor},
                )
                externs[limit] = extern_products(path)
                compile_s[limit] = time.perf_counter() - started
                runners[limit] = aoti_package_runner(str(path))
            blocks = {limit: {batch: [] for batch in BATCHES} for limit in args.limits}
            difference = {limit: {} for limit in args.limits}
            for batch in BATCHES:
                base = arguments_at(example, inputs, batch)
                reference = None
                for limit, runner in runners.items():
                    call = [t.clone() for t in base]
                    outputs = runner(call)
                    seen = [t.clone() for t in (*outputs, *call[inputs:])]  # the warm-up calls update the state
                    reference = reference or seen
                    difference[limit][batch] = max(
                        ((x.double() - y.double()).abs().max().item() for x, y in zip(seen, reference) if x.numel()),
                        default=0.0,
                    )
                    for _ in range(30):
                        runner(call)
            gc.collect()
            gc.disable()  # its collections, set off by the lists each call returns, would land in any block
            for round_index in range(args.rounds):
                order = args.limits[round_index % len(args.limits) :] + args.limits[: round_index % len(args.limits)]
                for batch in BATCHES:
                    call_args = arguments_at(example, inputs, batch)
                    for limit in order:
                        runner = runners[limit]
                        started = time.process_time()
                        for _ in range(args.calls):
                            runner(call_args)
                        blocks[limit][batch].append((time.process_time() - started) / args.calls * 1e6)
            gc.enable()
            results[model] = {
                "blocks": blocks,
                "compile_s": compile_s,
                "extern_products": externs,
                "difference": difference,
            }
            print(
                model, {lim: {b: statistics.median(v) for b, v in d.items()} for lim, d in blocks.items()}, flush=True
            )
    load = (load_start, os.getloadavg()[0])
    text = report(results, args, load, argv)
    Path(f"{out}.md").write_text(text)
    Path(f"{out}.json").write_text(json.dumps({"load_average": load, "results": results}, indent=1) + "\n")
    print(text)
    return results


def report(
    results: dict[str, dict], args: argparse.Namespace, load: tuple[float, float], argv: list[str] | None
) -> str:
    command = " ".join(
        [".venv/bin/python bench/experiments/small_products.py", *(sys.argv[1:] if argv is None else argv)]
    )
    base = args.limits[0]
    lines = [
        "# A package's train program with small matrix products rewritten as multiply and sum",
        "",
        f"`{command}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}; one thread;",
        f"{args.rounds} rounds of blocks of {args.calls} calls alternating between the limits; CPU time per call",
        f"(process_time, the Python call included); load average {load[0]:.1f} at the start, {load[1]:.1f} at the end",
        "(the 2-core VM shared with other sessions). Limit 0: no product rewritten (the program as built before).",
        "",
        "| model | limit | extern GEMM calls | batch 8 | batch 64 | / limit 0 (8, 64) | largest difference | compile |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, result in results.items():
        medians = {limit: {b: statistics.median(v) for b, v in d.items()} for limit, d in result["blocks"].items()}
        for limit, median in medians.items():
            ratios = ", ".join(f"{median[b] / medians[base][b]:.2f}x" for b in BATCHES)
            differences = max(result["difference"][limit].values())
            lines.append(
                f"| {model} | {limit} | {result['extern_products'][limit]} | {median[8]:.1f} us | {median[64]:.1f} us"
                f" | {ratios} | {differences:.1e} | {result['compile_s'][limit]:.0f} s |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
