"""Private scratch folders in the temporary directory that a process killed while holding one does not leave
behind.

A folder holds a lock file that its process keeps locked (``flock``) until the folder is removed, and gets its
name only once locked (made under a pending name, then renamed). Making a folder first removes this user's
folders of the same prefix whose lock no process holds: their process ended without removing them (killed,
crashed, ``os._exit``). Without ``flock`` (Windows) folders are made and removed the same way, never reclaimed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import weakref
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".in-use"  # the lock file in each folder
_PENDING = ".pending-"  # a folder's name until its lock is held


class ScratchFolder:
    """A new private (mode 0700) folder ``path`` in the temporary directory, named ``prefix`` plus a random
    suffix, removed by ``remove()``, when this object is collected or at exit of the process that made it."""

    def __init__(self, prefix: str) -> None:
        if not prefix or os.sep in prefix or prefix.startswith("."):
            raise ValueError(f"prefix: expected a plain file name prefix, got {prefix!r}")
        directory = tempfile.gettempdir()
        reclaim_abandoned(directory, prefix)
        pending = Path(tempfile.mkdtemp(prefix=_PENDING + prefix, dir=directory))
        self.path = pending.with_name(pending.name[len(_PENDING) :])
        lock = None
        try:
            lock = _held_lock(pending)
            os.rename(pending, self.path)  # fails over a non-empty folder: every held one holds its lock file
        except BaseException:
            _remove(pending, lock)
            raise
        self._finalizer = weakref.finalize(self, _release, os.getpid(), self.path, lock)

    def remove(self) -> None:
        """Remove the folder and everything in it (again, or in a process forked from this one: nothing)."""
        self._finalizer()


def reclaim_abandoned(directory: str | os.PathLike, prefix: str) -> list[Path]:
    """Remove the folders in ``directory`` named ``prefix``... (or pending) that this user owns and whose lock no
    process holds; the folders removed. Folders without a lock file (an earlier release's, or one being made) and
    links are kept."""
    removed: list[Path] = []
    if fcntl is None:
        return removed
    with contextlib.suppress(OSError), os.scandir(os.fspath(directory)) as entries:
        for entry in entries:
            if entry.name.startswith((prefix, _PENDING + prefix)) and _reclaim(Path(entry.path)):
                removed.append(Path(entry.path))
    return removed


def _reclaim(folder: Path) -> bool:
    try:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its process is alive
        os.close(fd)
        return False
    _remove(folder, fd)
    return True


def _held_lock(folder: Path) -> int | None:
    """The descriptor of ``folder``'s new lock file, locked (None without flock)."""
    if fcntl is None:
        return None
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _release(owner: int, folder: Path, lock: int | None) -> None:
    """Remove ``folder`` in the process that made it (``owner``), not in a child forked from it that exits."""
    if os.getpid() == owner:
        _remove(folder, lock)


def _remove(folder: Path, lock: int | None) -> None:
    """Remove ``folder``, then release its lock: while it is held no other process reclaims the folder."""
    shutil.rmtree(folder, ignore_errors=True)
    if lock is not None:
        os.close(lock)
