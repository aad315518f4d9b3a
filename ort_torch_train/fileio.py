"""Atomic file and folder writes (a temp file or folder in the target's directory, flushed, fsynced, renamed) that
stay in the folder named, bounded reads of regular files, and a lock serialising the writers of one file across
processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path, PureWindowsPath
from typing import BinaryIO

from .errors import PathOutsideError, SpecialFileError

try:
    import fcntl
except ImportError:  # Windows: no flock; path_lock goes through filelock
    fcntl = None  # type: ignore[assignment]


def path_inside(folder: str | os.PathLike, name: object, what: str) -> Path:
    """``folder / name``: the path a writer may write for ``name`` (a file name or relative path,
    maybe read from a file), refused with PathOutsideError when ``name`` is empty, absolute or holds a
    ``..`` part, or when the path resolves, through symbolic links (its own included), outside ``folder``.
    ``what`` names where ``name`` came from (a key, an option) in the message."""
    text = os.fspath(name) if isinstance(name, (str, os.PathLike)) else name
    if not isinstance(text, str):
        raise PathOutsideError(f"{what}: expected a file name, got {text!r}")
    parts = text.replace("\\", "/").split("/")
    if not text.strip() or os.path.isabs(text) or PureWindowsPath(text).anchor or ".." in parts:
        raise PathOutsideError(
            f"{what} {text!r} leaves the folder {os.fspath(folder)!r}: expected a name inside it "
            "(no '..' part, not absolute)"
        )
    base = os.path.realpath(folder if os.fspath(folder) else ".")
    target = Path(folder) / text
    resolved = os.path.realpath(target)
    if not _within(base, resolved):
        raise PathOutsideError(
            f"{what} {text!r}: {os.fspath(target)!r} is a symbolic link (or under one) leading to "
            f"{resolved!r}, outside the folder {base!r}"
        )
    return target


def _within(base: str, resolved: str) -> bool:
    try:
        return os.path.commonpath([base, resolved]) == base
    except ValueError:  # Windows: another drive
        return False


def require_regular_or_absent(path: str | os.PathLike, what: str = "output path") -> None:
    """Refuse a path that names a directory, device, FIFO or socket: a save would replace it."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"cannot write to {os.fspath(path)!r}: it is a directory")
    if not stat.S_ISREG(mode):
        raise SpecialFileError(
            f"cannot write the {what} {os.fspath(path)!r}: it is a {_kind(mode)}, not a regular file "
            "(a save replaces the file at its path; choose a regular file's path)"
        )


def open_regular_file(path: str | os.PathLike, what: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file (a FIFO or device never blocks
    the open: it is refused). FileNotFoundError / IsADirectoryError / SpecialFileError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"{what} {os.fspath(path)!r} is a directory, expected a file")
        if not stat.S_ISREG(mode):
            raise SpecialFileError(f"{what} {os.fspath(path)!r} is a {_kind(mode)}, expected a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_descriptor(fd: int, offset: int, nbytes: int) -> bytearray:
    """``nbytes`` bytes of the open file ``fd`` from ``offset`` (fewer only at the end of the file), read
    into one buffer (no chunks joined: a large file is held once)."""
    buffer = bytearray(nbytes)
    view, position = memoryview(buffer), 0
    while position < nbytes:
        count = os.preadv(fd, [view[position : position + (1 << 30)]], offset + position)
        if count == 0:
            break
        position += count
    view.release()
    if position < nbytes:
        del buffer[position:]
    return buffer


def read_regular_file(path: str | os.PathLike, what: str, limit: int | None = None) -> bytearray:
    """The bytes of the regular file at ``path`` (refused over ``limit`` bytes, or when special)."""
    fd = open_regular_file(path, what)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise SpecialFileError(f"{what} {os.fspath(path)!r} holds {size} bytes, more than the {limit} expected")
        return read_descriptor(fd, 0, size)
    finally:
        os.close(fd)


_HELD = threading.local()  # the directories whose write lock this thread holds


@contextlib.contextmanager
def path_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock for writing ``path``, so that concurrent writers of one path, in any
    process or thread, take turns: a lock on its directory (no lock file is left behind; writers of
    other files there wait too). Released when the holder dies. A thread that already holds it (a
    signal handler's write interrupting a write) is refused: waiting for itself would never end."""
    target = Path(path)
    directory = os.path.realpath(target.parent if str(target.parent) else ".")
    held: set[str] = _HELD.__dict__.setdefault("directories", set())
    if directory in held:
        raise RuntimeError(
            f"cannot write {os.fspath(path)!r}: this thread is already writing a file in {directory!r} "
            "(a write started from a signal handler that interrupted another write?)"
        )
    with _directory_lock(directory):
        held.add(directory)
        try:
            yield
        finally:
            held.discard(directory)


@contextlib.contextmanager
def _directory_lock(directory: str) -> Iterator[None]:
    if fcntl is None:  # Windows cannot open a directory: filelock's lock file stands for it
        from filelock import FileLock

        with FileLock(os.path.join(directory, ".ort-torch-train.lock")):
            yield
        return
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(file)`` on a temp file beside ``path``, then atomically replace ``path``.

    A failure at any point leaves the previous file at ``path`` untouched. A path naming a
    directory, device, FIFO or socket is refused (it would be replaced by a regular file), and so is a
    symbolic link leading out of the path's folder (``path_inside``).
    """
    given = Path(path)
    directory = given.parent if str(given.parent) else Path(".")
    target = path_inside(directory, given.name, "output path")
    require_regular_or_absent(target)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        if hasattr(os, "fchmod"):  # POSIX; Windows keeps its default
            os.fchmod(fd, default_file_mode())
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


def atomic_folder(path: str | os.PathLike, fill: Callable[[Path], object], *, durable: bool = True) -> None:
    """Call ``fill(folder)`` on a new temp folder beside ``path``, fsync what it wrote (unless not ``durable``: a
    scratch folder the process removes), then put it at ``path`` in place of the folder there, if any (moved aside,
    then removed). A failure while filling leaves ``path`` untouched. A path naming a file or a symbolic link is
    refused, and so is a path leading out of its folder (``path_inside``).
    """
    given = Path(path)
    directory = given.parent if str(given.parent) else Path(".")
    target = path_inside(directory, given.name, "output folder")
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise SpecialFileError(f"output folder {os.fspath(target)!r}: expected a folder or nothing, got a file or link")
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory))
    try:
        os.chmod(scratch, 0o777 & ~_umask())  # what mkdir would give (mkdtemp gives 0o700)
        fill(scratch)
        if durable:
            _fsync_tree(scratch)
        if target.is_dir():
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=directory))
            os.replace(target, aside / target.name)
            os.replace(scratch, target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if durable:
        _fsync_directory(directory)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"))
    return next((name for test, name in kinds if test(mode)), "socket" if stat.S_ISSOCK(mode) else "special file")


def default_file_mode() -> int:
    """0o666 minus the process umask: what open() would give a new file (mkstemp gives 0o600)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder``, and each folder's entries, to disk."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as written:
                os.fsync(written.fileno())
        _fsync_directory(Path(root))


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
