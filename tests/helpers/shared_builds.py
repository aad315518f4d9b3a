"""Builds that cost seconds (a native library, a package of AOT-compiled steps, a program linked against them),
made once per test run and shared by every test and every pytest-xdist worker of the run.

The workers' temporary folders share the run's parent folder (``tmp_path_factory``'s base); a build goes there,
under an exclusive lock, and is marked done only once it completed: a worker that asks while another builds waits
for it, and a build that failed (or skipped) is tried again by the next test that needs it."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this test run sees (the run's base temporary folder)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base folder is a child of the run's
        root = root.parent
    return root / "shared-builds"


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The path ``name`` (a file or folder) under ``shared_root``, made by ``build(path)`` unless an earlier
    call of this run completed it."""
    target = shared_root(tmp_path_factory) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    done = target.parent / f".{target.name}.built"
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            if target.is_dir():  # what a failed build left
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
            build(target)
            done.write_text(name)
    return target
