"""libort_torch_train under valgrind: does the library leak?

    .venv/bin/python bench/experiments/native_leaks.py [--out FILE]

Builds the library and tests/native/api_coverage.c (every OrtTrainingApi function, its error cases and
NULL arguments, on the MLP fixture) and runs it under ``valgrind --leak-check=full`` with
``PYTHONMALLOC=malloc`` (so valgrind sees Python's objects). The interpreter is never finalized, so Python,
torch and ONNX Runtime leave blocks behind at exit; a loss record is counted as this library's when, walking
its stack from the allocation up, a frame of libort_torch_train comes before any frame that runs Python code
(an object the library made and lost, or memory it allocated itself). Takes minutes: torch is imported under
valgrind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from ort_torch_train.native import build
from ort_torch_train.native.build import find_compiler

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "native" / "api_coverage.c"
ARTIFACTS = ROOT / "tests" / "fixtures" / "mlp_ce_adamw_sched" / "artifacts"
RECORD = re.compile(
    r"^==\d+== ([\d,]+) (?:\([\d,]+ direct, [\d,]+ indirect\) )?bytes in [\d,]+ blocks are (\w+ ?\w*) lost"
)
RUNS_PYTHON = re.compile(
    r"PyObject_Call|PyObject_Vectorcall|_PyEval|PyEval_|_PyObject_Call|PyImport|PyRun_|Py_Initialize|_PyFunction"
)


def records(log: str) -> list[tuple[int, str, list[str]]]:
    """(bytes, kind, frames) of each loss record in a valgrind log."""
    found = []
    lines = log.splitlines()
    for index, line in enumerate(lines):
        if "lost in loss record" not in line:
            continue
        match = RECORD.match(line)
        if not match:
            continue
        frames = []
        for next_index in range(index + 1, len(lines)):
            text = lines[next_index].split("== ", 1)[-1].strip()
            if not text.startswith(("at ", "by ")):
                break
            frames.append(text)
        found.append((int(match.group(1).replace(",", "")), match.group(2), frames))
    return found


def from_library(frames: list[str]) -> bool:
    """Whether a libort_torch_train frame comes before any frame that runs Python code."""
    for frame in frames:
        if "libort_torch_train" in frame or re.search(r"\bott_\w+", frame):
            return True
        if RUNS_PYTHON.search(frame):
            return False
    return False


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    flags = build(ROOT / "bench" / ".cache" / "native")
    program = flags.prefix / "bin" / "api_coverage"
    program.parent.mkdir(exist_ok=True)
    compile_command = [find_compiler(), "-std=c11", "-g", "-O1", *flags.cflags, f"-I{PROGRAM.parent}", str(PROGRAM)]
    subprocess.run([*compile_command, "-o", str(program), *flags.libs, "-lm"], check=True)
    with tempfile.TemporaryDirectory() as scratch:
        log_file = Path(scratch) / "valgrind.log"
        env = dict(os.environ, PYTHONMALLOC="malloc", ORT_TORCH_TRAIN_THREADS="1")
        command = ["valgrind", "--leak-check=full", "--show-leak-kinds=definite,indirect,possible"]
        command += ["--undef-value-errors=no", "--num-callers=40"]
        command += [f"--log-file={log_file}", str(program), str(ARTIFACTS), scratch]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        log = log_file.read_text()
    found = records(log)
    ours = [(size, kind, frames) for size, kind, frames in found if from_library(frames)]
    summary = re.findall(r"(definitely|indirectly|possibly) lost: ([\d,]+) bytes", log)
    result = {
        "command": "bench/experiments/native_leaks.py",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "program_exit": done.returncode,
        "program_finished": "done" in done.stdout,
        "seconds": round(seconds, 1),
        "valgrind_summary": {kind: int(size.replace(",", "")) for kind, size in summary},
        "loss_records": len(found),
        "records_with_a_frame_of_this_library": sum(1 for _, _, frames in found if any("ott_" in f for f in frames)),
        "records_from_this_library": len(ours),
        "bytes_from_this_library": sum(size for size, _, _ in ours),
        "records_from_this_library_by_kind": {
            kind: sum(1 for _, k, _ in ours if k == kind) for kind in ("definitely", "indirectly", "possibly")
        },
        "examples_from_this_library": [frames[:8] for _, _, frames in ours[:5]],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "examples_from_this_library"}, indent=1))
    for frames in result["examples_from_this_library"]:
        print("\n".join(["---", *frames]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
