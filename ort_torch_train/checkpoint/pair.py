"""All-or-nothing saves of a checkpoint with external data (``<path>`` + ``<path>.data``).

Two files cannot be replaced in one step, so a save with external data runs a small commit
protocol around a manifest ``<path>.manifest`` (JSON: size and BLAKE2b digest of both files):

1. the new files are written completely under pending names ``.<name>.pending`` and
   ``.<name>.data.pending`` (each through an atomic temp file);
2. the manifest is replaced by one describing the new pair, marked ``pending`` (the commit point);
3. the pending files are renamed onto ``<path>.data`` and ``<path>``;
4. the manifest is rewritten without the ``pending`` mark.

A reader follows the manifest: while it is pending, each file is taken from its pending name if that
still exists (rename not done yet). A pair where one file matches the manifest and the other does
not is a torn pair and is refused; a pair where neither matches was rewritten by another tool (ORT)
and is read unchecked. The next save finishes an interrupted commit and removes stale temp files.
The files themselves stay byte-identical to ORT's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from ..errors import CheckpointError
from ..fileio import atomic_write, atomic_write_bytes

_DIGEST = "blake2b"


def manifest_path(path: Path) -> Path:
    """The manifest that binds a checkpoint to its external data file."""
    return Path(os.fspath(path) + ".manifest")


def _pending(path: Path) -> Path:
    return path.with_name(f".{path.name}.pending")


def _digest_file(path: Path) -> dict[str, int | str]:
    digest = hashlib.blake2b()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return {"size": path.stat().st_size, _DIGEST: digest.hexdigest()}


def _digest_bytes(data: bytes | bytearray | memoryview) -> dict[str, int | str]:
    return {"size": len(data), _DIGEST: hashlib.blake2b(data).hexdigest()}


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


def _read_manifest(path: Path) -> dict | None:
    try:
        text = manifest_path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint manifest {str(manifest_path(path))!r} cannot be read: {error}") from None
    try:
        manifest = json.loads(text)
        for key in ("checkpoint", "data"):
            entry = manifest[key]
            if not isinstance(entry["size"], int) or not isinstance(entry[_DIGEST], str):
                raise TypeError(key)
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"checkpoint manifest {str(manifest_path(path))!r} is malformed ({error!r}); expected "
            "JSON with the size and digest of the checkpoint and of its data file"
        ) from None
    return manifest


def _write_manifest(path: Path, checkpoint: dict, data: dict, pending: bool) -> None:
    manifest = {"format": 1, "pending": pending, "checkpoint": checkpoint, "data": data}
    atomic_write_bytes(manifest_path(path), json.dumps(manifest).encode())


def remove_stale_files(path: Path) -> None:
    """Finish an interrupted commit at path, then delete temp files left by killed saves."""
    manifest = _read_manifest(path)
    if manifest is not None and manifest.get("pending"):
        for final in (Path(os.fspath(path) + ".data"), path):
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


def commit_pair(path: Path, encoded: bytes | bytearray | memoryview, write_data: Callable[[Writer], None]) -> None:
    """Replace the checkpoint at path and its data file as one unit (see the module docstring)."""
    remove_stale_files(path)
    data_path = Path(os.fspath(path) + ".data")
    writers: list[_HashingWriter] = []

    def hashed(file: BinaryIO) -> None:
        writers.append(_HashingWriter(file))
        write_data(writers[-1])

    atomic_write(_pending(data_path), hashed)
    atomic_write_bytes(_pending(path), encoded)
    data = {"size": writers[-1].size, _DIGEST: writers[-1].digest.hexdigest()}
    checkpoint = _digest_bytes(encoded)
    _write_manifest(path, checkpoint, data, pending=True)
    os.replace(_pending(data_path), data_path)
    os.replace(_pending(path), path)
    _write_manifest(path, checkpoint, data, pending=False)


def drop_manifest(path: Path) -> None:
    """Forget the pair binding after a save without external data replaced the checkpoint."""
    try:
        os.unlink(manifest_path(path))
    except FileNotFoundError:
        pass


class PairReader:
    """Which files to read for the checkpoint at path, and the check that they belong together."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.manifest = _read_manifest(path)
        pending = bool(self.manifest and self.manifest.get("pending"))
        self.checkpoint_file = self._choose(path, pending)
        self.data_file = self._choose(Path(os.fspath(path) + ".data"), pending)
        self._checkpoint_matches: bool | None = None

    @staticmethod
    def _choose(final: Path, pending: bool) -> Path:
        return _pending(final) if pending and _pending(final).is_file() else final

    def note_checkpoint_bytes(self, data: bytes | bytearray | memoryview) -> None:
        """Record whether the checkpoint bytes read are the ones the manifest names."""
        if self.manifest is not None:
            self._checkpoint_matches = _digest_bytes(data) == self.manifest["checkpoint"]

    def check_data_file(self) -> None:
        """Refuse a data file that does not belong to the checkpoint read (a torn pair)."""
        if self.manifest is None or not self.data_file.is_file():
            return
        data_matches = _digest_file(self.data_file) == self.manifest["data"]
        if self._checkpoint_matches == data_matches:
            return  # the pair the manifest names, or both rewritten by another tool
        newer, older = ("data file", "checkpoint") if data_matches else ("checkpoint", "data file")
        raise CheckpointError(
            f"checkpoint {str(self.path)!r} and its external data file {str(self.data_file)!r} do "
            f"not belong together (torn pair): the {newer} matches {str(manifest_path(self.path))!r}"
            f" but the {older} does not. One of them was replaced without the other (an "
            "interrupted save by another tool, or a copied file); restore both files together."
        )
