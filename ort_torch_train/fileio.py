"""Atomic file writes: a temp file in the target's directory, flushed, fsynced, renamed."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(file)`` on a temp file beside ``path``, then atomically replace ``path``.

    A failure at any point leaves the previous file at ``path`` untouched.
    """
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"cannot write to {str(target)!r}: it is a directory")
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, _default_file_mode())
        with os.fdopen(fd, "wb") as tmp:
            write(tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda f: f.write(data))


def _default_file_mode() -> int:
    """0o666 minus the process umask: what open() would give a new file (mkstemp gives 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
