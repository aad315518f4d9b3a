"""The compile cache, always on: compiled steps saved in a per-user directory and loaded by later processes.

``Module(compile=...)`` uses ``$ORT_TORCH_TRAIN_CACHE_DIR`` (``off`` switches it off), else
``$XDG_CACHE_HOME/ort_torch_train``, else ``~/.cache/ort_torch_train``; ``compile_cache=DIR`` names
another directory and ``compile_cache=False`` switches it off (the CLI: ``--compile-cache DIR``,
``--no-compile-cache``). Each Module's engine holds the cache its option names (``compile_cache_for``):
one Module's option leaves the others' caches alone. A step compiled with a cache is saved there at
once (one signed file per entry: ``cache_store.py``), with the C++ libraries it loads; a later process
with the same model, update, input signature, options, torch build and CPU loads it instead of
compiling. Entries are signed with a key only this user's cache holds: a cache directory cannot be
exchanged between users or machines (each builds its own), and a file this cache did not write is
refused, never loaded.

The explicit calls, for a process that wants another directory for its later Modules or a copy:

    load_compile_cache("~/.cache/my_job")   # Modules built from now on with compile_cache=None use it
    ...train with Module(..., compile=True)...
    save_compile_cache("/elsewhere")        # also write the steps this process compiled or loaded there

What stays process-wide is ``ProcessCompileCaches``: the record of the steps this process compiled or
loaded (what ``save_compile_cache`` writes), the directory ``load_compile_cache`` chose, and one
``CompileCache`` per directory (its key and vector-ISA probe read once).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ort_torch_train.errors import InputError
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.cache_store import CacheStore, default_cache_dir

log = logging.getLogger(__name__)

CompileCacheSetting = str | os.PathLike | bool | None


class ProcessCompileCaches:
    """The compile caches of one process: one ``CompileCache`` per directory, all recording their steps in
    ``steps`` ((what, data) by key), and the directory ``choose`` made the default (None: the environment's)."""

    def __init__(self) -> None:
        self.steps: dict[str, tuple[str, bytes]] = {}
        self._caches: dict[Path, CompileCache] = {}
        self._stores: dict[Path, CacheStore] = {}
        self._chosen: Path | None = None

    def cache_for(self, setting: CompileCacheSetting = None) -> CompileCache | None:
        """The cache ``setting`` names: None or True the chosen directory, else the default one; a path
        that directory; False none. Raises InputError for a directory named here that is not safe to
        load code from; the default one is then only skipped, with a warning (None)."""
        store = self.store_for(setting)
        if store is None:
            return None
        cache = self._caches.get(store.directory)
        if cache is None:
            cache = self._caches[store.directory] = CompileCache(store, self.steps)
            cache.trust_vector_isa_probe()
            log.info("compile cache: %s", store.directory)
        return cache

    def store_for(self, setting: CompileCacheSetting = None) -> CacheStore | None:
        """The directory of ``cache_for``'s cache, opened without inductor's settings (which programs
        compiled ahead of time do not read: ``package/on_demand.py``); ``cache_for``'s errors."""
        if setting is False:
            return None
        directory: Path | None
        if isinstance(setting, (str, os.PathLike)):
            explicit, directory = True, Path(setting).expanduser()
        else:
            explicit, directory = False, self._chosen or default_cache_dir()
        if directory is None:
            return None
        store = self._stores.get(directory.absolute())
        if store is not None:
            return store
        try:
            store = CacheStore(directory)
        except InputError as error:
            if explicit:
                raise
            log.warning("compile cache off: %s", error)
            return None
        self._stores[store.directory] = store
        return store

    def choose(self, directory: str | os.PathLike) -> CompileCache:
        """Make ``directory`` the cache of the Modules built from now on with ``compile_cache=None``
        (``cache_for``'s errors)."""
        cache = self.cache_for(directory)
        assert cache is not None, "a directory named explicitly gives a cache or raises"
        self._chosen = cache.store.directory
        return cache


_PROCESS_CACHES = ProcessCompileCaches()  # save_compile_cache writes what every Module of the process compiled


def process_caches() -> ProcessCompileCaches:
    """This process's compile caches (``ProcessCompileCaches``)."""
    return _PROCESS_CACHES


def compile_cache_store(setting: CompileCacheSetting = None) -> CacheStore | None:
    """The directory of the compile cache ``setting`` names (``ProcessCompileCaches.store_for``)."""
    return process_caches().store_for(setting)


def compile_cache_for(setting: CompileCacheSetting = None) -> CompileCache | None:
    """The compile cache ``setting`` names, for an engine to hold (``ProcessCompileCaches.cache_for``)."""
    return process_caches().cache_for(setting)


def load_compile_cache(directory: str | os.PathLike) -> bool:
    """Use ``directory`` as the compile cache of the Modules built from now on with ``compile_cache=None``;
    False when it holds no entries yet. Raises InputError for a path that is not a directory of this user's."""
    return process_caches().choose(directory).store.entry_count() > 0


def save_compile_cache(directory: str | os.PathLike) -> int:
    """Write the steps this process compiled or loaded through a compile cache, and their libraries, into
    ``directory`` (those it lacks or holds refused entries for); returns how many steps were written."""
    steps = process_caches().steps
    if not steps:
        return 0
    target = CompileCache(CacheStore(directory))
    written = 0
    for key, (what, data) in steps.items():
        if target.save_step(key, data, what, replace=False):
            written += 1
    return written
