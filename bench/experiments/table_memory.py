"""Peak memory of reading a large Parquet file (a list column) and a large CSV file (one column per value)
with ``trainer.tables.read_table``, before and after the change that streams tables in record batches.

    .venv/bin/python bench/experiments/table_memory.py [--mb 400] [--data /tmp/ort_table_bench]
        [--before dd0e116] [--out bench/results/<time>-table-memory.md]

The data files are generated in ``--data`` (never in the repository): ``train.parquet`` holds an int64
label and a float32 image column of 144 values per row, in row groups of 50,000 rows; the same rows in one
row group (as ``pyarrow.parquet.write_table`` writes a file of this size); ``train.csv`` 144 float columns
of 4 decimals and a label. Each (file, code) pair is read in a fresh process: the code of ``--before`` (exported with
``git archive``) and the working tree's. Reported: the bytes of the arrays read, the process's peak RSS
(``VmHWM``) before reading (imports done) and after, and the growth over the arrays' bytes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 144

READ = """
import json, re, sys, time
def peak():  # VmHWM: this process's peak RSS (ru_maxrss would include the parent's, kept across exec)
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1)) * 1024
sys.path.insert(0, sys.argv[1])
from ort_torch_train.trainer.tables import read_table
import pyarrow.dataset, pyarrow.parquet, pyarrow.csv  # imports counted before reading
before = peak()
start = time.perf_counter()
arrays = read_table(sys.argv[2])
seconds = time.perf_counter() - start
after = peak()
print(json.dumps({"before": before, "after": after, "seconds": seconds,
                  "arrays": sum(a.nbytes for a in arrays.values())}))
"""


def make_files(folder: Path, megabytes: int) -> dict[str, Path]:
    """The Parquet and CSV files of about ``megabytes`` each (made once)."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pa_parquet

    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "parquet, 50k-row groups": folder / f"train-{megabytes}mb.parquet",
        "parquet, one row group": folder / f"train-{megabytes}mb-one-group.parquet",
        "csv": folder / f"train-{megabytes}mb.csv",
    }
    rng = np.random.default_rng(0)
    if not files["parquet, 50k-row groups"].exists():
        rows, chunk = megabytes * 2**20 // (WIDTH * 4 + 8), 50_000
        with pa_parquet.ParquetWriter(files["parquet, 50k-row groups"], pa.schema([("label", pa.int64()), ("image", pa.list_(pa.float32(), WIDTH))])) as writer:  # fmt: skip
            for begin in range(0, rows, chunk):
                count = min(chunk, rows - begin)
                image = rng.standard_normal(count * WIDTH, dtype=np.float32)
                labels = pa.array(rng.integers(0, 10, count))
                writer.write_table(
                    pa.table({"label": labels, "image": pa.FixedSizeListArray.from_arrays(image, WIDTH)})
                )
    if not files["parquet, one row group"].exists():  # as pyarrow's write_table leaves a file of this size
        whole = pa_parquet.read_table(files["parquet, 50k-row groups"]).combine_chunks()
        pa_parquet.write_table(whole, files["parquet, one row group"], row_group_size=2**24)
        del whole
    if not files["csv"].exists():
        with pa_csv.CSVWriter(files["csv"], pa.schema([*((f"px{i}", pa.float64()) for i in range(WIDTH)), ("label", pa.int64())])) as writer:  # fmt: skip
            while files["csv"].stat().st_size < megabytes * 2**20:
                values = np.round(rng.random((20_000, WIDTH)), 4)
                columns = {f"px{i}": values[:, i] for i in range(WIDTH)}
                writer.write_table(pa.table({**columns, "label": rng.integers(0, 10, 20_000)}))
    return files


def export(commit: str, folder: Path) -> Path:
    """The package as of ``commit``, extracted into ``folder``."""
    archive = subprocess.run(["git", "archive", commit, "ort_torch_train"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def measure(source: Path, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", READ, str(source), str(path)], capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=400, help="size of each data file in MiB")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "ort_table_bench")
    parser.add_argument("--before", default="dd0e116", help="the commit whose read_table is measured as 'before'")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}-table-memory.md")  # fmt: skip
    args = parser.parse_args()
    files = make_files(args.data, args.mb)
    lines = [
        f"# Table reading memory ({args.mb} MiB files)",
        "",
        f"`{' '.join(['.venv/bin/python', 'bench/experiments/table_memory.py', *sys.argv[1:]])}`",
        "",
        "| file | code | file MiB | arrays MiB | RSS before read MiB | peak RSS MiB | peak growth / arrays | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as before_tree:
        sources = {f"before ({args.before})": export(args.before, Path(before_tree)), "after (this tree)": ROOT}
        for kind, path in files.items():
            for label, source in sources.items():
                found = measure(source, path)
                mib = path.stat().st_size / 2**20
                if "error" in found:
                    row = f"| {kind} | {label} | {mib:.0f} | failed: {found['error']} | | | | |"
                else:
                    growth = (found["after"] - found["before"]) / found["arrays"]
                    row = (
                        f"| {kind} | {label} | {mib:.0f} | {found['arrays'] / 2**20:.0f} | "
                        f"{found['before'] / 2**20:.0f} | {found['after'] / 2**20:.0f} | {growth:.2f} | "
                        f"{found['seconds']:.1f} |"
                    )
                print(row, flush=True)
                lines.append(row)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
