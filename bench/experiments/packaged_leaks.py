"""libort_torch_train_packaged (the runtime with no Python) under valgrind: does it leak, does it touch memory it
does not own?

    .venv/bin/python bench/experiments/packaged_leaks.py [--out FILE]

Builds the runtime, the mlp fixture's package and tests/native/packaged_boundary.c (every entry point of the
runtime with NULLs, handles in the wrong state, released, foreign and stack-address handles of every kind and bad
sizes, releases of such handles, threads making and releasing values, then train steps, an export and its
inference, everything released) and runs the program under ``valgrind --leak-check=full``. Valgrind runs no AVX-512
instruction, so the package is compiled for AVX2 (``TORCHINDUCTOR_CPP_MARCH=x86-64-v3``, ``ATEN_CPU_CAPABILITY=avx2``)
and the program runs libtorch's AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``). A loss record is counted as the
runtime's when a frame of libort_torch_train_packaged is on its allocation stack (what the runtime allocated,
or had libtorch allocate, and lost); "still reachable" blocks (libtorch's process-wide registries) are not losses.
Every invalid read, write or free is counted, wherever it is. Takes minutes: compiling the package, and libtorch
loading under valgrind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "native" / "packaged_boundary.c"
ARTIFACTS = ROOT / "tests" / "fixtures" / "mlp_ce_adamw_sched" / "artifacts"
LIBRARY = "libort_torch_train_packaged"
RECORD = re.compile(r"^==\d+== ([\d,]+) (?:\([\d,]+ direct, [\d,]+ indirect\) )?bytes in [\d,]+ blocks are (\w+) lost")
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3"}  # what valgrind runs
INVALID = re.compile(r"^==\d+== (Invalid (?:read|write|free)|Mismatched free)")


def records(log: str) -> list[tuple[int, str, list[str]]]:
    """(bytes, kind, frames) of each loss record in a valgrind log."""
    found = []
    lines = log.splitlines()
    for index, line in enumerate(lines):
        match = RECORD.match(line)
        if not match or "loss record" not in line:
            continue
        frames = []
        for text in lines[index + 1 :]:
            frame = text.split("== ", 1)[-1].strip()
            if not frame.startswith(("at ", "by ")):
                break
            frames.append(frame)
        found.append((int(match.group(1).replace(",", "")), match.group(2), frames))
    return found


def invalid_accesses(log: str) -> list[str]:
    """The first line of each invalid read, write or free valgrind reported, with the frame that made it."""
    lines = log.splitlines()
    found = []
    for index, line in enumerate(lines):
        if INVALID.match(line):
            frame = lines[index + 1].split("== ", 1)[-1].strip() if index + 1 < len(lines) else ""
            found.append(f"{line.split('== ', 1)[-1]} {frame}")
    return found


def analyse(log: str) -> dict[str, object]:
    """Losses of the runtime (definitely and indirectly lost, by bytes) and every memory error."""
    ours = [(size, kind, frames) for size, kind, frames in records(log) if any(LIBRARY in f for f in frames)]
    lost = {kind: sum(size for size, k, _ in ours if k == kind) for kind in ("definitely", "indirectly", "possibly")}
    return {
        "runtime_lost_bytes": lost,
        "runtime_records": [{"bytes": size, "kind": kind, "stack": frames[:8]} for size, kind, frames in ours],
        "invalid_accesses": invalid_accesses(log),
        "summary": [
            line.split("== ", 1)[-1] for line in log.splitlines() if "lost:" in line or "ERROR SUMMARY" in line
        ],
    }


def run(program: Path, package: Path, out: Path, output: str, log: Path, timeout: float) -> subprocess.CompletedProcess:
    """``program`` on ``package`` under valgrind, its log written to ``log``."""
    command = ["valgrind", "--leak-check=full", "--show-leak-kinds=definite,indirect,possible", f"--log-file={log}"]
    command += [str(program), str(package), str(ARTIFACTS / "checkpoint"), str(out), output, str(ARTIFACTS)]
    environment = {**os.environ, **AVX2, "OMP_NUM_THREADS": "1", "ORT_TORCH_TRAIN_PACKAGE": str(package)}
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the result as JSON to this file")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    from ort_torch_train.native.build import find_compiler
    from ort_torch_train.native.packaged_build import build_packaged

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        flags = build_packaged(root / "prefix")
        program = root / "packaged_boundary"
        compile_line = [find_compiler(), "-std=c11", "-O1", "-g", f"-I{PROGRAM.parent}", *flags.cflags, str(PROGRAM)]
        subprocess.run([*compile_line, "-o", str(program), *flags.libs], check=True)
        package = [sys.executable, "-m", "ort_torch_train", "package", str(ARTIFACTS), "--out", str(root / "package")]
        subprocess.run(package, check=True, env={**os.environ, **AVX2})
        (root / "out").mkdir()
        started = time.perf_counter()
        done = run(program, root / "package", root / "out", "logits", root / "valgrind.log", 3600)
        seconds = time.perf_counter() - started
        result = {"returncode": done.returncode, "seconds": round(seconds, 1), "load": os.getloadavg()}
        result |= analyse((root / "valgrind.log").read_text())
        result["stdout_tail"] = done.stdout.splitlines()[-2:]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
