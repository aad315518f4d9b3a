"""Scratch folders (``ort_torch_train/scratch.py``): a folder whose process was killed is removed when the next
one is made (one killed while it was being made too); a live process's folder, an earlier release's (no lock
file), a link and a folder whose lock file is not made yet are kept; a child forked from the process that made
a folder leaves it when it exits."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ort_torch_train.scratch import LOCK_NAME, ScratchFolder, reclaim_abandoned
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import line_within, scaled

PREFIX = "ort_torch_train_test_"
HOLDER = f"""
import sys, time
from ort_torch_train.scratch import ScratchFolder
folder = ScratchFolder({PREFIX!r})
(folder.path / "program.so").write_bytes(b"held")
print(folder.path, flush=True)
time.sleep(600)
"""


@pytest.fixture
def holders() -> Iterator[Callable[[Path], tuple[subprocess.Popen[str], Path]]]:
    """Starts processes each holding a scratch folder in a given temporary directory (the process and its
    folder); each is killed at the end of the test if it was not before."""
    started: list[subprocess.Popen[str]] = []

    def start(directory: Path) -> tuple[subprocess.Popen[str], Path]:
        env = {**os.environ, "TMPDIR": str(directory)}
        command = [sys.executable, "-c", HOLDER]
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout is not None
        return process, Path(line_within(process.stdout, scaled(60), "the holder's folder").strip())

    yield start
    for process in started:
        if process.poll() is None:
            _killed(process)


def _killed(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=scaled(30))
    assert process.stdout is not None
    process.stdout.close()


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as this process's temporary directory."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_killed_processs_folder_goes_when_the_next_is_made_and_no_other_does(
    temporary: Path, holders: Callable[[Path], tuple[subprocess.Popen[str], Path]]
) -> None:
    killed, abandoned = holders(temporary)
    alive, held = holders(temporary)
    earlier = temporary / f"{PREFIX}earlier"  # an earlier release's folder: no lock file
    earlier.mkdir()
    victim = temporary / "victim"
    victim.mkdir()
    (victim / "data").write_bytes(b"keep")
    (temporary / f"{PREFIX}link").symlink_to(victim, target_is_directory=True)
    _killed(killed)
    assert (abandoned / "program.so").read_bytes() == b"held"  # nobody removed it at the kill
    mine = ScratchFolder(PREFIX)
    assert not abandoned.exists()
    assert (held / "program.so").read_bytes() == b"held" and (held / LOCK_NAME).is_file()
    assert earlier.is_dir() and (victim / "data").read_bytes() == b"keep"
    assert mine.path.parent == temporary and mine.path.name.startswith(PREFIX)
    assert (mine.path.stat().st_mode & 0o777) == 0o700
    assert reclaim_abandoned(temporary, PREFIX) == []  # held ones stay, in this process too
    _killed(alive)
    assert reclaim_abandoned(temporary, PREFIX) == [held]
    assert mine.path.is_dir()
    mine.remove()
    assert not mine.path.exists() and earlier.is_dir() and (victim / "data").read_bytes() == b"keep"


def test_a_folder_goes_with_its_object_and_a_pending_one_stays(temporary: Path) -> None:
    folder = ScratchFolder(PREFIX)
    path = folder.path
    (path / "nested").mkdir()
    del folder
    gc.collect()
    assert not path.exists()
    pending = temporary / f".pending-{PREFIX}x"  # made, its lock file not yet made
    pending.mkdir()
    left = temporary / f".pending-{PREFIX}y"  # its process killed after it made the lock file, before the rename
    left.mkdir()
    (left / LOCK_NAME).touch()
    ScratchFolder(PREFIX).remove()
    assert [p.name for p in temporary.iterdir()] == [pending.name]


@pytest.mark.parametrize("prefix", ["", ".hidden", "a/b"])
def test_a_prefix_that_is_no_plain_name_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix: expected a plain file name prefix"):
        ScratchFolder(prefix)


def test_a_forked_child_that_exits_leaves_its_parents_folder(temporary: Path) -> None:
    folder = ScratchFolder(PREFIX)
    child = os.fork()
    if child == 0:  # what the child's exit runs: the finalizer
        folder.remove()
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    assert folder.path.is_dir() and (folder.path / LOCK_NAME).is_file()
    folder.remove()
    assert not folder.path.exists()
