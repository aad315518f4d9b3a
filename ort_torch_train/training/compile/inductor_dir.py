"""What the compile cache trusts of inductor's cache directory: only files this user wrote, in folders no one
else can write.

Inductor's default directory is ``<tmp>/torchinductor_<user>``, made with ``os.makedirs(exist_ok=True)``
and never checked, so another local user may have created it or written into it. A library signed into
the per-user compile cache is restored into fresh directories and loaded by later runs; it must not be
one that someone else planted there.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)


def untrusted_reason(status: os.stat_result, path: Path, kind: str) -> str | None:
    """Why ``path`` (a ``kind``: "folder" or "file") cannot be trusted, or None: of this user, others cannot write."""
    is_kind = stat.S_ISDIR(status.st_mode) if kind == "folder" else stat.S_ISREG(status.st_mode)
    if not is_kind:
        return f"{path} is not a {kind}"
    if status.st_uid != os.geteuid():
        return f"{path} belongs to uid {status.st_uid}, not to this user (uid {os.geteuid()})"
    if status.st_mode & 0o022:
        return f"{path} can be written by others (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def private_folder_reason(root: Path) -> str | None:
    """Why inductor's cache folder ``root`` cannot be trusted, or None."""
    try:
        return untrusted_reason(os.stat(root), root, "folder")
    except OSError as error:
        return f"{root} cannot be read ({error})"


def read_own_file(root: Path, path: Path) -> bytes | None:
    """The bytes of ``path`` under ``root`` when this user wrote it and no one else could have (``root``, its
    subfolder and the file are this user's and not writable by others); None, logged, otherwise."""
    reason = private_folder_reason(root)
    try:
        if reason is None:
            reason = untrusted_reason(os.lstat(path.parent), path.parent, "folder")
        if reason is None:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as file:
                reason = untrusted_reason(os.fstat(file.fileno()), path, "file")
                if reason is None:
                    return file.read()
    except OSError as error:
        reason = f"{path} cannot be read ({error})"
    log.warning("compile cache: not signing the library %s from inductor's cache dir (%s)", path, reason)
    return None
