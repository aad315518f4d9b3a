"""The compile cache on disk: a per-user directory of signed entries, one file per entry.

Each entry (a compiled step's serialized form, a C++ library inductor built, the vector-ISA probe's
result) is one file named by a digest of what it is for, written atomically (mode 0600), so that
processes filling one directory at once never drop each other's entries. A file holds a magic line,
an HMAC-SHA256 over the rest, a JSON header naming its kind, key and fingerprint (torch build, Python,
OS, C library, CPU features and, for steps, inductor's settings), then its payload. The HMAC's key is
``<dir>/key``: 32 random bytes written by the first process that used the directory. Nothing is
unpickled here; an entry's payload reaches torch's loader (which unpickles it) or inductor's cache dir
only after its owner, permissions, signature and header were checked, so a file that this user's
cache did not write, or one with a flipped bit, is refused (and the step compiled again).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
import platform
import re
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import torch

from ort_torch_train.errors import InputError
from ort_torch_train.fileio import atomic_write
from ort_torch_train.torch_internals import cpu_features, inductor_config

log = logging.getLogger(__name__)

ENV_VARIABLE = "ORT_TORCH_TRAIN_CACHE_DIR"  # a directory, or "off"
_MAGIC = b"ort-torch-train compile cache entry 1\n"
_KEY_BYTES = 32
_MAC_BYTES = 32
_HEADER_LENGTH_BYTES = 4
_ENTRIES = "entries-1"
_POSIX_FILE_CALLS = ("O_NOFOLLOW", "O_NONBLOCK", "fchmod", "geteuid")  # what the trust checks rely on
# a library's path under inductor's cache dir: <two characters>/<file name>, no dot first
LIBRARY_NAME = re.compile(r"[a-z0-9]{2}/[A-Za-z0-9_-][A-Za-z0-9_.-]*\.(so|o)")


class RefusedEntry(Exception):
    """An entry file the cache did not write, or one altered since (the reason is the message)."""


def default_cache_dir() -> Path | None:
    """``$ORT_TORCH_TRAIN_CACHE_DIR`` (None when it is "off"), else ``$XDG_CACHE_HOME/ort_torch_train``,
    else ``~/.cache/ort_torch_train``."""
    chosen = os.environ.get(ENV_VARIABLE)
    if chosen:
        return None if chosen.strip().lower() == "off" else Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ort_torch_train"


def platform_fingerprint() -> str:
    """What loading compiled code depends on besides the code: torch's build, Python, OS, C library, CPU."""
    described = [
        torch.__version__,
        torch.version.git_version,
        sys.implementation.cache_tag,
        platform.system(),
        platform.machine(),
        platform.libc_ver(),
        cpu_features(),
    ]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()


def step_fingerprint() -> str:
    """``platform_fingerprint`` and inductor's current global settings (those a step was compiled under);
    ``cpp.vec_isa_ok`` None (probe the vector ISAs) counts as True (trust them): the cache sets it so
    only where a former probe found every ISA working."""
    settings = {name: _canonical(value) for name, value in inductor_config().save_config_portable().items()}
    settings["cpp.vec_isa_ok"] = settings.get("cpp.vec_isa_ok") is not False
    described = json.dumps([platform_fingerprint(), settings], sort_keys=True, default=repr)
    return hashlib.sha256(described.encode()).hexdigest()


def _canonical(value: object) -> object:
    """``value`` with sets sorted (their order changes between processes) and callables by name."""
    if isinstance(value, (set, frozenset)):
        return sorted(repr(item) for item in value)
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return value


class CacheStore:
    """A compile-cache directory of this user's: entries written and read back verified."""

    def __init__(self, directory: str | os.PathLike) -> None:
        """Open (creating) ``directory``; raises InputError when it or its key is not safe to load code from,
        or when this platform cannot tell (no POSIX file ownership, modes or O_NOFOLLOW, as on Windows)."""
        missing = [name for name in _POSIX_FILE_CALLS if not hasattr(os, name)]
        if missing:
            raise InputError(
                f"compile cache directory {os.fspath(directory)!r}: the compile cache checks file owners, modes "
                f"and symbolic links, which this platform ({sys.platform}) does not offer (os lacks "
                f"{', '.join(missing)}); expected a POSIX system, or compile_cache=False"
            )
        self.directory = Path(directory).expanduser().absolute()
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            _check_private(self.directory, os.stat(self.directory), "directory")
            self._entries = self.directory / _ENTRIES
            try:
                self._entries.mkdir(mode=0o700)
            except FileExistsError:
                pass
            _check_private(self._entries, os.lstat(self._entries), "directory")
            self._key = _read_or_create_key(self.directory / "key")
        except (OSError, RefusedEntry) as error:
            raise InputError(
                f"compile cache directory {os.fspath(directory)!r}: expected a directory of this user's "
                f"(uid {os.geteuid()}) that no one else can write, with a key file of mode 0600; {error}"
            ) from error

    def __repr__(self) -> str:
        return f"CacheStore({os.fspath(self.directory)!r})"

    def path_of(self, kind: str, key: str, fingerprint: str) -> Path:
        """The file of an entry: a digest of its kind, key and fingerprint, inside the directory."""
        name = hashlib.sha256(f"{kind}\0{key}\0{fingerprint}".encode()).hexdigest()
        return self._entries / name

    def contains(self, kind: str, key: str, fingerprint: str) -> bool:
        """Whether an entry file (verified or not) is there."""
        return self.path_of(kind, key, fingerprint).is_file()

    def entry_count(self) -> int:
        """How many entry files the directory holds."""
        return sum(1 for path in self._entries.iterdir() if not path.name.startswith("."))

    def write(
        self, kind: str, key: str, fingerprint: str, payload: bytes, extra: Mapping[str, object] | None = None
    ) -> Path:
        """Store ``payload`` as the entry (kind, key, fingerprint), atomically; ``extra`` joins its header."""
        header = json.dumps({**(extra or {}), "kind": kind, "key": key, "fingerprint": fingerprint}).encode()
        body = len(header).to_bytes(_HEADER_LENGTH_BYTES, "big") + header + payload
        data = _MAGIC + hmac.digest(self._key, _MAGIC + body, "sha256") + body
        path = self.path_of(kind, key, fingerprint)

        def write_private(file: BinaryIO) -> None:
            os.fchmod(file.fileno(), 0o600)
            file.write(data)

        atomic_write(path, write_private)
        return path

    def read(self, kind: str, key: str, fingerprint: str) -> tuple[dict, bytes] | None:
        """The header and payload of the entry (kind, key, fingerprint); None when there is none.

        Raises RefusedEntry for a file that is not this user's, others can write, fails its signature
        or names another entry.
        """
        path = self.path_of(kind, key, fingerprint)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO never blocks
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise RefusedEntry(f"{path} is a symbolic link") from None
            raise RefusedEntry(f"{path} cannot be opened ({error})") from None
        with os.fdopen(fd, "rb") as file:
            _check_private(path, os.fstat(file.fileno()), "file")
            data = file.read()
        return self._verified(path, data, kind, key, fingerprint)

    def _verified(self, path: Path, data: bytes, kind: str, key: str, fingerprint: str) -> tuple[dict, bytes]:
        start = len(_MAGIC) + _MAC_BYTES
        if not data.startswith(_MAGIC) or len(data) < start + _HEADER_LENGTH_BYTES:
            raise RefusedEntry(f"{path} is not a compile cache entry (it does not start with {_MAGIC!r})")
        mac, body = data[len(_MAGIC) : start], data[start:]
        if not hmac.compare_digest(mac, hmac.digest(self._key, _MAGIC + body, "sha256")):
            raise RefusedEntry(f"{path} fails its signature: written by another cache, or altered since")
        length = int.from_bytes(body[:_HEADER_LENGTH_BYTES], "big")
        try:
            header = json.loads(body[_HEADER_LENGTH_BYTES : _HEADER_LENGTH_BYTES + length])
        except ValueError as error:
            raise RefusedEntry(f"{path} has no readable header ({error})") from None
        if not isinstance(header, dict):
            raise RefusedEntry(f"{path} has a header that is not an object")
        named = (header.get("kind"), header.get("key"), header.get("fingerprint"))
        if named != (kind, key, fingerprint):
            raise RefusedEntry(f"{path} holds the entry {named}, not {(kind, key, fingerprint)}")
        return header, body[_HEADER_LENGTH_BYTES + length :]


def _check_private(path: Path, status: os.stat_result, what: str) -> None:
    """Refuse ``path`` unless it is a ``what`` (directory or file) of this user's that no one else can write."""
    is_right_type = stat.S_ISDIR(status.st_mode) if what == "directory" else stat.S_ISREG(status.st_mode)
    if not is_right_type:
        raise RefusedEntry(f"{path} is not a {what}")
    if status.st_uid != os.geteuid():
        raise RefusedEntry(f"{path} belongs to uid {status.st_uid}, not to this user (uid {os.geteuid()})")
    if status.st_mode & 0o022:
        raise RefusedEntry(f"{path} can be written by others (mode {stat.S_IMODE(status.st_mode):o})")


def _read_or_create_key(path: Path) -> bytes:
    """The directory's signing key: read (owner and mode 0600 checked), or written first by this process."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO never blocks
    except FileNotFoundError:
        return _create_key(path)
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        _check_private(path, status, "file")
        if status.st_mode & 0o077:
            raise RefusedEntry(f"{path} can be read by others (mode {stat.S_IMODE(status.st_mode):o}, expected 600)")
        key = file.read()
    if len(key) != _KEY_BYTES:
        raise RefusedEntry(f"{path} holds {len(key)} bytes, expected a {_KEY_BYTES}-byte key")
    return key


def _create_key(path: Path) -> bytes:
    """A new random key, linked into place whole: of two processes creating it at once, one key wins."""
    temporary = path.with_name(f".key.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    key = secrets.token_bytes(_KEY_BYTES)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(key)
            file.flush()
            os.fsync(file.fileno())
        os.link(temporary, path)
    except FileExistsError:
        return _read_or_create_key(path)
    finally:
        temporary.unlink(missing_ok=True)
    log.info("compile cache: created the signing key %s", path)
    return key
