"""The compile cache, always on: compiled steps saved in a per-user directory and loaded by later processes.

``Module(compile=...)`` uses ``$ORT_TORCH_TRAIN_CACHE_DIR`` (``off`` switches it off), else
``$XDG_CACHE_HOME/ort_torch_train``, else ``~/.cache/ort_torch_train``; ``compile_cache=DIR`` names
another directory and ``compile_cache=False`` switches it off (the CLI: ``--compile-cache DIR``,
``--no-compile-cache``). A step compiled with the cache in use is saved there at once (one signed file
per entry: ``cache_store.py``), with the C++ libraries it loads; a later process with the same model,
update, input signature, options, torch build and CPU loads it instead of compiling. Entries are
signed with a key only this user's cache holds: a cache directory cannot be exchanged between users
or machines (each builds its own), and a file this cache did not write is refused, never loaded.

The explicit calls, for a process that builds its steps without ``Module`` or wants another directory:

    load_compile_cache("~/.cache/my_job")   # before the first compiled step: use this directory
    ...train with Module(..., compile=True, compile_cache="~/.cache/my_job")...
    save_compile_cache("/elsewhere")        # also write the steps this process compiled or loaded there
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ort_torch_train.errors import InputError
from ort_torch_train.training.compile import precompiled
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.cache_store import CacheStore, default_cache_dir

log = logging.getLogger(__name__)

CompileCacheSetting = str | os.PathLike | bool | None


def use_compile_cache(setting: CompileCacheSetting = None) -> CompileCache | None:
    """Use the compile cache ``setting`` names for the steps compiled from now on: None or True the
    cache in use, else the default directory; a path that directory; False none. Raises InputError for
    a directory named here that is not safe to load code from; the default one is then only skipped,
    with a warning."""
    active = precompiled.active_cache()
    if setting is False:
        precompiled.use_cache(None)
        return None
    explicit = not (setting is None or setting is True)
    if not explicit and active is not None:
        return active
    directory = Path(setting).expanduser() if isinstance(setting, (str, os.PathLike)) else default_cache_dir()
    if directory is None:
        precompiled.use_cache(None)
        return None
    if active is not None and active.store.directory == directory.absolute():
        return active
    try:
        store = CacheStore(directory)
    except InputError as error:
        if explicit:
            raise
        log.warning("compile cache off: %s", error)
        precompiled.use_cache(None)
        return None
    cache = CompileCache(store, None if active is None else active.steps)
    cache.trust_vector_isa_probe()
    precompiled.use_cache(cache)
    log.info("compile cache: %s", store.directory)
    return cache


def load_compile_cache(directory: str | os.PathLike) -> bool:
    """Use ``directory`` as the compile cache from now on (``use_compile_cache``); False when it holds
    no entries yet. Raises InputError for a path that is not a directory of this user's."""
    cache = use_compile_cache(directory)
    return cache is not None and cache.store.entry_count() > 0


def save_compile_cache(directory: str | os.PathLike) -> int:
    """Write the steps this process compiled or loaded through a compile cache, and their libraries, into
    ``directory`` (those it lacks); returns how many steps were written."""
    active = precompiled.active_cache()
    if active is None or not active.steps:
        return 0
    target = CompileCache(CacheStore(directory))
    written = 0
    for key, (what, data) in active.steps.items():
        if target.save_step(key, data, what, replace=False):
            written += 1
    return written
