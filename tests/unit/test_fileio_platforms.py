"""ort_torch_train.fileio without fcntl (as on Windows): the package imports, and path_lock serialises
writers through filelock's lock file instead of flock on the directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.timeouts import scaled

ROOT = Path(__file__).resolve().parents[2]

_WITHOUT_FCNTL = """
import sys, threading, time
sys.modules["fcntl"] = None  # import fcntl now raises ImportError, as on Windows
from ort_torch_train import fileio
assert fileio.fcntl is None
target = sys.argv[1] + "/out.bin"
inside, overlaps = [0], []
def writer(byte):
    with fileio.path_lock(target):
        inside[0] += 1
        overlaps.append(inside[0])
        time.sleep(0.05)
        fileio.atomic_write(target, lambda f: f.write(byte))
        inside[0] -= 1
threads = [threading.Thread(target=writer, args=(bytes([i]),)) for i in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
assert overlaps == [1, 1, 1], overlaps
print(open(target, "rb").read() in (b"\\x00", b"\\x01", b"\\x02"))
"""


def test_fileio_imports_and_locks_without_fcntl(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_FCNTL, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


_WITHOUT_POSIX_FILE_CALLS = """
import logging, os, sys
for name in ("O_NOFOLLOW", "fchmod", "geteuid"):  # as on Windows
    delattr(os, name)
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from ort_torch_train.errors import InputError
from ort_torch_train.training.compile.cache import compile_cache_for
os.environ["ORT_TORCH_TRAIN_CACHE_DIR"] = sys.argv[1] + "/default"
print("default:", compile_cache_for(None))
try:
    compile_cache_for(sys.argv[1] + "/named")
except InputError as error:
    print("named:", error)
"""


def test_the_compile_cache_is_off_where_the_os_cannot_check_owners_and_links(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_POSIX_FILE_CALLS, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        lines[0].startswith("compile cache off: compile cache directory")
        and "lacks O_NOFOLLOW, fchmod, geteuid" in lines[0]
    )
    assert lines[1] == "default: None"
    assert (
        lines[2].startswith(f"named: compile cache directory '{tmp_path}/named'") and "compile_cache=False" in lines[2]
    )
    assert not (tmp_path / "default").exists() and not (tmp_path / "named").exists()
