"""A package's programs loaded from their folders against the same programs as archive files, in turns, in one process.

    .venv/bin/python bench/experiments/program_folder_load.py PACKAGE_DIR [--rounds 21]
        [--out bench/results/STAMP-program-folder-load]

PACKAGE_DIR is a package ``ort-torch-train package`` built (program folders). Each program is also packed into an
archive file (``programs.pack_program``, the layout of torch's ``.pt2``) in a scratch folder; every round loads each
program once from its folder and once from its archive with libtorch's loader (``aoti_package_runner``, as the
runtime with no Python loads them), the order alternating, the loader released after each load. Reported per
program: the median wall time of a load from each, and what a load leaves in ``TMPDIR`` while the program is held
(the loader unpacks an archive there; a process that ends without releasing it leaves that behind). Writes OUT.md
and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from ort_torch_train.torch_internals import aoti_package_runner
from ort_torch_train.training.package.programs import pack_program

ROOT = Path(__file__).resolve().parents[2]


def load_ms(path: Path) -> float:
    """Milliseconds libtorch's loader takes to load the program at ``path`` (released after)."""
    started = time.perf_counter()
    run = aoti_package_runner(os.fspath(path))
    elapsed = time.perf_counter() - started
    del run
    return elapsed * 1e3


def left_while_held(path: Path, scratch: Path) -> tuple[int, int]:
    """The files and bytes a load of ``path`` puts in the temporary folder ``scratch`` while the program is held."""
    before = set(scratch.rglob("*"))
    run = aoti_package_runner(os.fspath(path))
    added = [item for item in scratch.rglob("*") if item not in before and item.is_file()]
    found = len(added), sum(item.stat().st_size for item in added)
    del run
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-program-folder-load", time.gmtime())
    names = sorted(path.name for path in args.package.iterdir() if path.is_dir())
    rows = []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        os.environ["TMPDIR"] = os.fspath(scratch / "tmp")  # libtorch's loader reads it at each load
        (scratch / "tmp").mkdir()
        load_start = os.getloadavg()[0]
        for name in names:
            sides = {"folder": args.package / name, "archive": scratch / f"{name}.pt2"}
            sides["archive"].write_bytes(pack_program(sides["folder"]))
            for path in sides.values():
                load_ms(path)  # the first load maps the shared object: not counted
            times: dict[str, list[float]] = {side: [] for side in sides}
            for round_index in range(args.rounds):
                order = list(sides)[round_index % 2 :] + list(sides)[: round_index % 2]
                for side in order:
                    times[side].append(load_ms(sides[side]))
            left = {side: left_while_held(path, scratch / "tmp") for side, path in sides.items()}
            folder, archive = statistics.median(times["folder"]), statistics.median(times["archive"])
            rows.append({"program": name, "folder_ms": folder, "archive_ms": archive, "left": left, "times": times})
        load_end = os.getloadavg()[0]
    lines = [
        f"# Program folders against archive files: {args.package}",
        "",
        f"`.venv/bin/python bench/experiments/program_folder_load.py {args.package} --rounds {args.rounds}`; load "
        f"average {load_start:.1f} at the start, {load_end:.1f} at the end; medians of {args.rounds} alternating "
        "loads, wall time, the loader released after each.",
        "",
        "| program | folder load | archive load | archive / folder | left in TMPDIR while held: folder | archive |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r['program']} | {r['folder_ms']:.2f} ms | {r['archive_ms']:.2f} ms | "
            f"{r['archive_ms'] / r['folder_ms']:.1f}x | {r['left']['folder'][0]} files, {r['left']['folder'][1]} B | "
            f"{r['left']['archive'][0]} files, {r['left']['archive'][1]} B |"
            for r in rows
        ),
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"load": [load_start, load_end], "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
