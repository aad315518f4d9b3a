"""Both native libraries and their boundary programs under AddressSanitizer and UBSan, on this machine's own
(AVX-512 where it has it) packages: what valgrind cannot run.

    .venv/bin/python bench/experiments/sanitized_native.py [--out FILE] [--work DIR] [--only native|packaged]

Builds libort_torch_train and libort_torch_train_packaged with ``-fsanitize=address,undefined
-fno-omit-frame-pointer -g`` (``build(..., sanitize=True)``, ``build_packaged(..., sanitize=True)``: the sources we
own; CPython, ONNX Runtime, libtorch and the compiled packages are not instrumented, their memory is checked only
where our code touches it), the test programs with the same flags, and the packages of copies of the mlp and
bn_frozen_stats fixtures' artifacts (``ort-torch-train package ARTIFACTS --out DIR``, compiled for this CPU). Then
runs, each once:

* tests/native/packaged_boundary.c on the mlp package (every entry point with bad arguments, training, export,
  inference), and tests/native/packaged_runtime.c on both packages (training, its boundary checks, checkpoint and
  export), with LeakSanitizer on;
* tests/native/api_coverage.c (every OrtTrainingApi function and its error cases), tests/native/boundary.c
  (``tensors``, ``handles``, ``fork``: NULL, short and foreign tensors at each entry point, released and unknown
  handles, a step in a child made by fork())
  and tests/native/custom_ops.c (a custom-op library's kernels run by a training session, four ways) against the
  CPython-embedding library, with ``detect_leaks=0``: the interpreter is never finalized, so the
  objects Python, torch and ONNX Runtime hold at exit would drown the report (native_leaks.py counts those under
  valgrind).

UBSan reports every finding and goes on; AddressSanitizer stops the program at its first. A finding is counted as
ours when a frame of its stack lies in ort_torch_train/native or tests/native. Takes minutes: the sanitized
runtime's compile against libtorch's headers, two package builds, torch's import under AddressSanitizer.
``--work DIR`` keeps the builds there and reuses the packages on the next run.
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
sys.path.insert(0, str(ROOT))

from ort_torch_train.native.build import SANITIZE, build, find_compiler  # noqa: E402
from ort_torch_train.native.packaged_build import build_packaged  # noqa: E402

PROGRAMS = ROOT / "tests" / "native"
FIXTURES = ROOT / "tests" / "fixtures"
CASES = ("mlp_ce_adamw_sched", "bn_frozen_stats")
STEPS = 6  # packaged_runtime.c's steps, as tests/integration/test_packaged_runtime.py runs it
OURS = re.compile(r"ort_torch_train/native/|tests/native/")
ASAN_ERROR = re.compile(r"^==\d+==ERROR: (AddressSanitizer|LeakSanitizer): (.*)$")
UBSAN_ERROR = re.compile(r"^(\S+:\d+:\d+): runtime error: (.*)$")
FRAME = re.compile(r"^\s+#\d+ 0x[0-9a-f]+ in (.*)$")


def findings(log: str) -> list[dict[str, object]]:
    """Each sanitizer report in a program's stderr: its kind, message, first frames and whether a frame is ours."""
    lines = log.splitlines()
    found: list[dict[str, object]] = []
    for index, line in enumerate(lines):
        asan, ubsan = ASAN_ERROR.match(line), UBSAN_ERROR.match(line)
        if not asan and not ubsan:
            continue
        frames = []
        for text in lines[index + 1 : index + 60]:
            frame = FRAME.match(text)
            if frame:
                frames.append(frame.group(1))
            elif frames and not text.strip():
                break
        if asan:
            kind, message, where = asan.group(1), asan.group(2), ""
        else:
            kind, message, where = "UBSan", ubsan.group(2), ubsan.group(1)
        ours = bool(OURS.search(where)) or any(OURS.search(frame) for frame in frames)
        found.append({"kind": kind, "message": message, "where": where, "ours": ours, "frames": frames[:10]})
    return found


def compile_program(source: Path, output: Path, cflags: list[str], libs: list[str]) -> Path:
    """``source`` compiled with the sanitizers and linked against a sanitized library."""
    cxx = source.suffix == ".cpp"
    compiler = (shutil.which("c++") or "g++") if cxx else find_compiler()
    command = [compiler, "-std=c++17" if cxx else "-std=c11", "-O1", *SANITIZE, f"-I{PROGRAMS}", *cflags]
    subprocess.run([*command, str(source), "-o", str(output), *libs, "-lpthread", "-lm"], check=True)
    return output


def package(case: str, work: Path) -> Path:
    """The package of a copy of the fixture's artifacts, built for this machine (reused when ``work`` has it)."""
    folder = work / "packages" / case
    if (folder / "native_steps.txt").is_file():
        return folder
    artifacts = work / "artifacts" / case
    if not artifacts.exists():
        shutil.copytree(FIXTURES / case / "artifacts", artifacts)
    cli = Path(sys.executable).with_name("ort-torch-train")
    subprocess.run([str(cli), "package", str(artifacts), "--out", str(folder)], check=True)
    return folder


def run(name: str, command: list[str], environment: dict[str, str], timeout: float) -> dict:
    """One program under the sanitizers: its exit, time, last lines and findings."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout)
    report = findings(done.stderr)
    lines = done.stdout.splitlines()
    return {
        "program": name,
        "arguments": command[1:],
        "returncode": done.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "members_called": sum(1 for line in lines if line.startswith("called ")),
        "refused_calls": sum(1 for line in lines if line.startswith("case "))
        or next((int(line.split()[1]) for line in lines if line.startswith("bad: ")), 0),
        "stdout_tail": lines[-2:],
        "damaged_checkpoints": [line for line in lines if line.startswith("damaged checkpoints: ")],
        "stderr_tail": done.stderr.splitlines()[-3:] if done.returncode else [],
        "findings": report,
        "ours": sum(1 for item in report if item["ours"]),
    }


def export_outputs(folder: Path) -> str:
    """The outputs of the package's first prepared export, comma-separated."""
    lines = (folder / "native_steps.txt").read_text().splitlines()
    return ",".join(line.split()[2] for line in lines if line.startswith("export_output 0 "))


def packaged_runs(work: Path, environment: dict[str, str]) -> list[dict]:
    """packaged_boundary.c on the mlp package and packaged_runtime.c on both packages."""
    from tests.helpers.fixture_runs import write_raw_inputs

    flags = build_packaged(work / "packaged", sanitize=True)
    bin_dir = work / "packaged" / "bin"
    bin_dir.mkdir(exist_ok=True)
    boundary = compile_program(
        PROGRAMS / "packaged_boundary.c", bin_dir / "packaged_boundary", flags.cflags, flags.libs
    )
    runtime = compile_program(PROGRAMS / "packaged_runtime.c", bin_dir / "packaged_runtime", flags.cflags, flags.libs)
    packages = {case: package(case, work) for case in CASES}
    results = []
    mlp, artifacts = packages[CASES[0]], FIXTURES / CASES[0] / "artifacts"
    out = Path(tempfile.mkdtemp(dir=work))
    arguments = [str(boundary), str(mlp), str(artifacts / "checkpoint"), str(out), "logits", str(artifacts)]
    results.append(run("packaged_boundary.c", arguments, {**environment, "ORT_TORCH_TRAIN_PACKAGE": str(mlp)}, 1800))
    for case, folder in packages.items():
        run_dir = Path(tempfile.mkdtemp(dir=work))
        write_raw_inputs(case, run_dir / "data", STEPS)
        (run_dir / "out").mkdir()
        arguments = [str(runtime), str(folder), str(FIXTURES / case / "artifacts" / "checkpoint")]
        arguments += [str(run_dir / "data"), str(run_dir / "out"), str(STEPS), "1", "0.weight", export_outputs(folder)]
        results.append(run(f"packaged_runtime.c ({case})", arguments, environment, 1800))
    return results


def native_runs(work: Path, environment: dict[str, str]) -> list[dict]:
    """api_coverage.c, boundary.c (tensors, handles, fork) and custom_ops.c against the CPython-embedding library."""
    flags = build(work / "native", sanitize=True)
    bin_dir = flags.prefix / "bin"
    bin_dir.mkdir(exist_ok=True)
    coverage = compile_program(PROGRAMS / "api_coverage.c", bin_dir / "api_coverage", flags.cflags, flags.libs)
    boundary = compile_program(PROGRAMS / "boundary.c", bin_dir / "boundary", flags.cflags, flags.libs)
    artifacts = FIXTURES / CASES[0] / "artifacts"
    environment = {**environment, "ASAN_OPTIONS": environment["ASAN_OPTIONS"] + ":detect_leaks=0"}
    environment["ORT_TORCH_TRAIN_THREADS"] = "1"
    out = Path(tempfile.mkdtemp(dir=work))
    results = [run("api_coverage.c", [str(coverage), str(artifacts), str(out)], environment, 3600)]
    for mode in ("tensors", "handles", "fork"):
        results.append(run(f"boundary.c {mode}", [str(boundary), str(artifacts), mode], environment, 3600))
    return results + custom_op_runs(work, flags.cflags, flags.libs, environment)


def custom_op_runs(work: Path, cflags: list[str], libs: list[str], environment: dict[str, str]) -> list[dict]:
    """tests/native/custom_ops.c with tests/native/custom_op_library.c (both sanitized), as
    tests/integration/test_native_custom_ops.py runs them: training and eval through the kernels, ONNX Runtime's
    inference of the export, an op the gradient flows through, a library that is absent, a kernel that fails."""
    from tests.integration.test_native_custom_ops import artifacts

    library = work / "native" / "lib" / "libott_test_ops.so"
    command = [find_compiler(), "-std=c11", "-O1", *SANITIZE, "-shared", "-fPIC", *cflags]
    subprocess.run([*command, str(PROGRAMS / "custom_op_library.c"), "-o", str(library)], check=True)
    program = compile_program(PROGRAMS / "custom_ops.c", work / "native" / "bin" / "custom_ops", cflags, libs)
    folder = Path(tempfile.mkdtemp(dir=work))
    upstream = artifacts(folder / "upstream", custom_after_parameters=False)
    downstream = artifacts(folder / "downstream", custom_after_parameters=True)
    failing = artifacts(folder / "failing", custom_after_parameters=False, shift=False)
    runs = {
        "train": ["train", str(library), str(upstream), str(folder)],
        "create (gradient through the op)": ["create", str(library), str(downstream)],
        "register (absent library)": ["register", str(folder / "absent.so")],
        "train (a kernel that fails)": ["train", str(library), str(failing), str(folder)],
    }
    return [
        run(f"custom_ops.c {name}", [str(program), *arguments], environment, 3600) for name, arguments in runs.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    parser.add_argument("--work", type=Path, help="build here and keep it (default: a temporary folder)")
    parser.add_argument("--only", choices=("native", "packaged"), help="run one library's programs only")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="sanitized-native-"))
    work.mkdir(parents=True, exist_ok=True)
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    environment["ASAN_OPTIONS"] = "abort_on_error=0:print_summary=1"
    environment["UBSAN_OPTIONS"] = "print_stacktrace=1"
    started = time.perf_counter()
    results = []
    if args.only != "native":
        results += packaged_runs(work, environment)
    if args.only != "packaged":
        results += native_runs(work, environment)
    summary = {
        "command": "bench/experiments/sanitized_native.py" + (f" --only {args.only}" if args.only else ""),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "flags": SANITIZE,
        "seconds": round(time.perf_counter() - started, 1),
        "load": os.getloadavg(),
        "runs": results,
        "findings_ours": sum(result["ours"] for result in results),
        "findings_all": sum(len(result["findings"]) for result in results),
    }
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
