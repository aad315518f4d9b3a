"""torch.compile's caches carried across processes: one portable file saved next to the artifacts.

torch keeps FX-graph, AOTAutograd and inductor caches on local disk (``TORCHINDUCTOR_CACHE_DIR``);
these functions move what a process compiled into a file (``torch.compiler.save_cache_artifacts``)
and preload it into a new process, on this or another machine with the same torch version.

    load_compile_cache("artifacts/compile.cache")   # before the first compiled step
    ...train with Module(..., compile=True)...
    save_compile_cache("artifacts/compile.cache")   # after it
"""

from __future__ import annotations

import os

import torch

from ort_torch_train.errors import InputError
from ort_torch_train.fileio import atomic_write_bytes


def load_compile_cache(path: str | os.PathLike) -> bool:
    """Preload the compile caches saved in ``path``; False when there is no such file yet."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return False
    try:
        info = torch.compiler.load_cache_artifacts(data)  # None (after a logged warning) when unreadable
        problem = None if info is not None else "torch could not read it"
    except Exception as exc:
        problem = str(exc)
    if problem is not None:
        raise InputError(f"compile cache {os.fspath(path)!r}: expected a file written by save_compile_cache "
                         f"with torch {torch.__version__}; could not load it ({problem})")
    return True


def save_compile_cache(path: str | os.PathLike) -> int:
    """Write what this process compiled so far to ``path`` (atomically); returns the bytes written (0: nothing)."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return 0
    data, _ = saved
    atomic_write_bytes(path, data)
    return len(data)
