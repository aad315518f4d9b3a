"""All-or-nothing saves of a checkpoint with external data (``<path>`` + ``<path>.data``), and reads
that see one saved pair whatever saves run meanwhile.

Two files cannot be replaced in one step, so a save with external data runs a small commit
protocol around a manifest ``<path>.manifest`` (JSON: size, BLAKE2b digest and file identity
(inode, mtime) of both files):

1. the new files are written completely under pending names ``.<name>.pending`` and
   ``.<name>.data.pending`` (each through an atomic temp file);
2. the manifest is replaced by one describing the new pair, marked ``pending`` (the commit point);
3. the pending files are renamed onto ``<path>.data`` and ``<path>``;
4. the manifest is rewritten without the ``pending`` mark.

Saves of one path take turns (``fileio.path_lock``); a save first finishes an interrupted commit and
removes the temp files left by killed saves. A reader opens both files once, while the manifest stays
the same (retrying when a save replaced it meanwhile), and reads everything from those descriptors:
renames never change an open file. While the manifest is pending, each file is taken from its
pending name if that still exists. A pair where one file is the manifest's own, untouched file and
the other is not is a torn pair and is refused; a pair whose files were both rewritten (by ORT's
save, which ignores the manifest, or by a copy) is read unchecked. The files themselves stay
byte-identical to ORT's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from ..errors import CheckpointError, SpecialFileError
from ..fileio import (
    atomic_write,
    atomic_write_bytes,
    open_regular_file,
    path_inside,
    path_lock,
    read_descriptor,
    read_regular_file,
    require_regular_or_absent,
)

log = logging.getLogger(__name__)

_DIGEST = "blake2b"
MANIFEST_LIMIT = 1 << 16  # bytes: a manifest is a few hundred
OPEN_ATTEMPTS = 20  # times a reader retries when saves keep replacing the pair while it opens it


def manifest_path(path: Path) -> Path:
    """The manifest that binds a checkpoint to its external data file."""
    return Path(os.fspath(path) + ".manifest")


def data_file_path(path: Path) -> Path:
    """The external data file of the checkpoint at path."""
    return Path(os.fspath(path) + ".data")


def _pending(path: Path) -> Path:
    return path.with_name(f".{path.name}.pending")


def _entry(size: int, digest: str, status: os.stat_result) -> dict[str, int | str]:
    return {"size": size, _DIGEST: digest, "inode": status.st_ino, "mtime_ns": status.st_mtime_ns}


def _same_content(size: int, digest: str, entry: dict) -> bool:
    return entry["size"] == size and entry[_DIGEST] == digest


def _same_file(status: os.stat_result, entry: dict) -> bool:
    """Whether the file is the very one the manifest recorded (manifests without identity: assumed)."""
    return entry.get("inode", status.st_ino) == status.st_ino and entry.get("mtime_ns", status.st_mtime_ns) == (
        status.st_mtime_ns
    )


class Writer(Protocol):
    """A binary file open for writing, as far as a data file's writer uses it."""

    def write(self, data: bytes | bytearray | memoryview, /) -> int: ...


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.digest, self.size = file, hashlib.blake2b(), 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.file.write(data)


def _manifest_text(path: Path) -> bytearray | None:
    """The manifest's bytes (None when there is none); read without blocking and with a size cap."""
    try:
        return read_regular_file(manifest_path(path), "checkpoint manifest", MANIFEST_LIMIT)
    except FileNotFoundError:
        return None
    except (OSError, SpecialFileError) as error:
        raise CheckpointError(f"checkpoint manifest {str(manifest_path(path))!r} cannot be read: {error}") from None


def _parse_manifest(path: Path, text: bytes | bytearray | None) -> dict | None:
    if text is None:
        return None
    try:
        manifest = json.loads(text.decode("utf-8"))
        for key in ("checkpoint", "data"):
            entry = manifest[key]
            if not isinstance(entry["size"], int) or not isinstance(entry[_DIGEST], str):
                raise TypeError(key)
            if not all(isinstance(entry.get(name, 0), int) for name in ("inode", "mtime_ns")):
                raise TypeError(f"{key} identity")
        manifest["pending"] = bool(manifest.get("pending"))
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"checkpoint manifest {str(manifest_path(path))!r} is malformed ({error!r}); expected JSON with "
            "the size and digest of the checkpoint and of its data file. Delete it to load the pair "
            "unchecked (the next save writes a new one)."
        ) from None
    return manifest


def _write_manifest(path: Path, checkpoint: dict, data: dict, pending: bool) -> None:
    manifest = {"format": 1, "pending": pending, "checkpoint": checkpoint, "data": data}
    atomic_write_bytes(manifest_path(path), json.dumps(manifest).encode())


def _remove_stale_files(path: Path) -> None:
    """Finish an interrupted commit at path, then delete temp files left by killed saves (the caller
    holds the path's lock: no other save of it is running). A malformed manifest is replaced."""
    try:
        manifest = _parse_manifest(path, _manifest_text(path))
    except CheckpointError as error:
        log.warning("%s; the save replaces it", error)
        manifest = None
    if manifest is not None and manifest["pending"]:
        for final in (data_file_path(path), path):
            if _pending(final).exists():
                os.replace(_pending(final), final)
        _write_manifest(path, manifest["checkpoint"], manifest["data"], pending=False)
    name = re.escape(path.name)
    temp = r"\.[a-z0-9_]{8}\.tmp"
    stale = re.compile(rf"\.\.?{name}(\.data|\.manifest)?(\.pending({temp})?|{temp})")
    directory = path.parent if str(path.parent) else Path(".")
    for entry in os.scandir(directory):
        if stale.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass


def _require_regular_targets(path: Path) -> None:
    """Refuse before writing a target that is a directory or special file, or a symlink out of the folder."""
    targets = ((path, "checkpoint"), (data_file_path(path), "external data file"), (manifest_path(path), "manifest"))
    for target, what in targets:
        path_inside(target.parent, target.name, what)
        require_regular_or_absent(target, what)


def replace_inline(path: Path, encoded: bytes | bytearray | memoryview) -> None:
    """Replace the checkpoint at path by a self-contained one (forgetting any pair binding)."""
    _require_regular_targets(path)
    with path_lock(path):
        _remove_stale_files(path)
        atomic_write_bytes(path, encoded)
        try:
            os.unlink(manifest_path(path))
        except FileNotFoundError:
            pass


def commit_pair(path: Path, encoded: bytes | bytearray | memoryview, write_data: Callable[[Writer], None]) -> None:
    """Replace the checkpoint at path and its data file as one unit (see the module docstring)."""
    _require_regular_targets(path)
    data_path = data_file_path(path)
    writers: list[_HashingWriter] = []

    def hashed(file: BinaryIO) -> None:
        writers.append(_HashingWriter(file))
        write_data(writers[-1])

    with path_lock(path):
        _remove_stale_files(path)
        atomic_write(_pending(data_path), hashed)
        atomic_write_bytes(_pending(path), encoded)
        data = _entry(writers[-1].size, writers[-1].digest.hexdigest(), os.stat(_pending(data_path)))
        checkpoint = _entry(len(encoded), hashlib.blake2b(encoded).hexdigest(), os.stat(_pending(path)))
        _write_manifest(path, checkpoint, data, pending=True)
        os.replace(_pending(data_path), data_path)
        os.replace(_pending(path), path)
        _write_manifest(path, checkpoint, data, pending=False)


def _open_checkpoint_file(final: Path, pending: bool, what: str) -> tuple[Path, int]:
    if pending:
        try:
            return _pending(final), open_regular_file(_pending(final), what)
        except FileNotFoundError:
            pass
    return final, open_regular_file(final, what)


def _manifest_key(path: Path) -> tuple | None:
    """What identifies the manifest now: its file identity and bytes (None: no manifest)."""
    text = _manifest_text(path)
    if text is None:
        return None
    status = os.stat(manifest_path(path))
    return status.st_ino, status.st_mtime_ns, text


class PairReader:
    """A checkpoint and its external data file, opened once as one saved pair (see the module docstring).

    Use as a context manager: the descriptors close at its end.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data_fd: int | None = None
        self.checkpoint_fd: int | None = None
        for _ in range(OPEN_ATTEMPTS):
            try:
                before = self._open(path)
                if _manifest_key(path) == before:
                    break
            except BaseException:
                self.close()
                raise
            self.close()
        else:
            raise CheckpointError(
                f"checkpoint {str(path)!r} was replaced by other saves {OPEN_ATTEMPTS} times while being "
                "opened; load it when the saves pause"
            )
        self.data_size = 0 if self.data_fd is None else os.fstat(self.data_fd).st_size
        self._checkpoint_digest: str | None = None

    def _open(self, path: Path) -> tuple | None:
        """Open the files the manifest names now; returns the manifest's key (None: no manifest)."""
        before = _manifest_key(path)
        self.manifest = _parse_manifest(path, None if before is None else before[2])
        pending = self.manifest is not None and self.manifest["pending"]
        self.checkpoint_file, self.checkpoint_fd = _open_checkpoint_file(path, pending, "checkpoint file")
        try:
            self.data_file, self.data_fd = _open_checkpoint_file(data_file_path(path), pending, "external data file")
        except FileNotFoundError:
            self.data_file, self.data_fd = data_file_path(path), None
        return before

    def __enter__(self) -> PairReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the descriptors."""
        for fd in (self.checkpoint_fd, self.data_fd):
            if fd is not None:
                os.close(fd)
        self.checkpoint_fd = self.data_fd = None

    def checkpoint_bytes(self) -> bytearray:
        """The checkpoint file's bytes."""
        assert self.checkpoint_fd is not None, "read after close"
        data = read_descriptor(self.checkpoint_fd, 0, os.fstat(self.checkpoint_fd).st_size)
        if self.manifest is not None:
            self._checkpoint_digest = hashlib.blake2b(data).hexdigest()
        return data

    def read_data(self, offset: int, nbytes: int) -> bytearray:
        """Bytes of the opened external data file (never reopened: a later save cannot change them)."""
        assert self.data_fd is not None, "no external data file"
        return read_descriptor(self.data_fd, offset, nbytes)

    def check_data_file(self) -> None:
        """Refuse a data file that does not belong to the checkpoint read (a torn pair)."""
        if self.manifest is None or self.data_fd is None or self.checkpoint_fd is None:
            return
        digest = hashlib.blake2b()
        for offset in range(0, self.data_size, 1 << 24):
            digest.update(self.read_data(offset, min(1 << 24, self.data_size - offset)))
        checkpoint_status, data_status = os.fstat(self.checkpoint_fd), os.fstat(self.data_fd)
        expected_checkpoint, expected_data = self.manifest["checkpoint"], self.manifest["data"]
        assert self._checkpoint_digest is not None, "checkpoint_bytes() first"
        checkpoint_matches = _same_content(checkpoint_status.st_size, self._checkpoint_digest, expected_checkpoint)
        data_matches = _same_content(self.data_size, digest.hexdigest(), expected_data)
        if checkpoint_matches == data_matches:
            return  # the pair the manifest names, or both rewritten by another tool
        kept = (data_status, expected_data) if data_matches else (checkpoint_status, expected_checkpoint)
        if not _same_file(*kept):
            return  # the matching file was rewritten too (ORT's save with unchanged data): not our pair
        newer, older = ("data file", "checkpoint") if data_matches else ("checkpoint", "data file")
        raise CheckpointError(
            f"checkpoint {str(self.path)!r} and its external data file {str(self.data_file)!r} do "
            f"not belong together (torn pair): the {newer} matches {str(manifest_path(self.path))!r}"
            f" but the {older} does not. One of them was replaced without the other (an "
            "interrupted save by another tool, or a copied file); restore both files together."
        )
