"""What the compile cache holds for a process: compiled steps, the C++ libraries they load, the ISA probe.

A step's entry (``precompiled.py``'s serialized step, keyed by its step key and ``step_fingerprint``)
lists the libraries inductor had built or loaded when it was saved; each library is an entry of its
own (keyed by its path under inductor's cache dir and ``platform_fingerprint``). Loading a step
first writes its verified libraries that inductor's cache dir lacks (a new container, a fresh /tmp),
sparing the g++ builds; a refused library is never written there (a later process whose steps use it writes its
entry again). Hits, misses and refusals are logged.
"""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path

from ort_torch_train.fileio import atomic_write_bytes
from ort_torch_train.torch_internals import inductor_cache_dir, inductor_config, inductor_module
from ort_torch_train.training.compile.cache_store import (
    LIBRARY_NAME,
    CacheStore,
    RefusedEntry,
    platform_fingerprint,
    step_fingerprint,
)
from ort_torch_train.training.compile.inductor_dir import private_folder_reason, read_own_file
from ort_torch_train.training.torch_settings import trust_vector_isas

log = logging.getLogger(__name__)


class CompileCache:
    """One cache directory as this process uses it; ``steps`` records the steps it loaded or compiled, (what,
    data) by key: the record given (the process's, shared by its caches) or one of its own."""

    def __init__(self, store: CacheStore, steps: dict[str, tuple[str, bytes]] | None = None) -> None:
        self.store = store
        self.steps = {} if steps is None else steps

    def load_step(self, key: str, what: str) -> bytes | None:
        """The saved ``what`` (a train step, an eval graph) under ``key``, its libraries restored; None
        on a miss or a refused entry (logged)."""
        try:
            found = self.store.read("step", key, step_fingerprint())
        except RefusedEntry as refused:
            log.warning("compile cache: refused the saved %s %s (%s); compiling it", what, key[:12], refused)
            return None
        if found is None:
            log.info("compile cache miss: no saved %s %s in %s; compiling it", what, key[:12], self.store.directory)
            return None
        header, data = found
        self.restore_libraries(header.get("libraries") or [])
        log.info("compile cache hit: the %s %s from %s", what, key[:12], self.store.directory)
        self.steps[key] = (what, data)
        return data

    def save_step(self, key: str, data: bytes, what: str, replace: bool = True) -> bool:
        """Keep the serialized ``what`` under ``key`` and write it (unless a verified entry is there and not
        ``replace``), the libraries not yet saved (or refused) and the ISA probe's result into the directory;
        whether the step was written (a failure is logged, never raised: a cache is an optimisation)."""
        self.steps[key] = (what, data)
        fingerprint = step_fingerprint()
        if not replace and self._holds_verified("step", key, fingerprint):
            return False
        try:
            libraries = self.save_libraries()
            self.save_vector_isa_probe()
            self.store.write("step", key, fingerprint, data, {"libraries": libraries, "what": what})
        except OSError as error:
            log.warning("compile cache: could not save the %s %s in %s (%s)", what, key[:12], self.store, error)
            return False
        log.info("compile cache: saved the %s %s in %s", what, key[:12], self.store.directory)
        return True

    def load_fallback(self, kind: str, key: str) -> str | None:
        """Why the step under ``key`` fell back to ``kind`` (``fallbacks.py``) in a process that saved it
        here; None when none did (a refused entry is logged)."""
        try:
            found = self.store.read(f"fallback-{kind.replace(' ', '-')}", key, step_fingerprint())
        except RefusedEntry as refused:
            log.warning("compile cache: refused the saved fallback %s (%s)", key[:12], refused)
            return None
        return None if found is None else found[1].decode("utf-8", "replace")

    def save_fallback(self, kind: str, key: str, reason: str) -> None:
        """Record that the step under ``key`` falls back to ``kind`` because of ``reason`` (a failure to
        write is logged, never raised)."""
        try:
            self.store.write(f"fallback-{kind.replace(' ', '-')}", key, step_fingerprint(), reason.encode())
        except OSError as error:
            log.warning("compile cache: could not save the fallback %s in %s (%s)", key[:12], self.store, error)

    def save_libraries(self) -> list[str]:
        """Write the libraries of this process's steps that the directory lacks or holds refused entries for
        (damaged, not this user's); returns all their names."""
        fingerprint = platform_fingerprint()
        root = Path(inductor_cache_dir())
        paths = compiled_library_paths()
        for name, path in paths.items():
            if not self._holds_verified("library", name, fingerprint):
                data = read_own_file(root, path)  # only what this user wrote where no one else can write
                if data is not None:
                    self.store.write("library", name, fingerprint, data)
        return sorted(paths)

    def restore_libraries(self, names: list[str]) -> int:
        """Write the verified library entries ``names`` that inductor's cache dir lacks; returns how many."""
        root = Path(inductor_cache_dir())
        fingerprint, restored = platform_fingerprint(), 0
        unsafe = private_folder_reason(root)
        if unsafe is not None:
            log.warning("compile cache: not restoring libraries into inductor's cache dir (%s)", unsafe)
            return 0
        for name in names:
            target = _library_target(root, name)
            if target is None:
                log.warning("compile cache: refused the library path %r (expected <dir>/<file> inside %s)", name, root)
                continue
            if target.exists():
                continue
            try:
                found = self.store.read("library", name, fingerprint)
            except RefusedEntry as refused:
                log.warning("compile cache: refused the library %s (%s); it will be built", name, refused)
                continue
            if found is not None:
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write_bytes(target, found[1])
                except OSError as error:
                    log.warning("compile cache: could not restore the library %s (%s); it will be built", name, error)
                    continue
                restored += 1
        if restored:
            log.info("compile cache: restored %d compiled libraries into %s", restored, root)
        return restored

    def save_vector_isa_probe(self) -> None:
        """Write inductor's vector-ISA probe result (x86 only) if the directory lacks it or holds an entry
        for it that is refused (damaged, not this user's)."""
        fingerprint = platform_fingerprint()
        if not _is_x86() or self._holds_verified("isa", "probe", fingerprint):
            return
        probe = [_reported_isas(), [str(isa) for isa in inductor_module("cpu_vec_isa").valid_vec_isa_list()]]
        self.store.write("isa", "probe", fingerprint, json.dumps(probe).encode())

    def trust_vector_isa_probe(self) -> None:
        """Skip inductor's vector ISA probe (it builds and loads test libraries) when a process saved it
        for this platform and found every ISA this CPU reports working (``cpp.vec_isa_ok``)."""
        if not _is_x86() or inductor_config().cpp.vec_isa_ok is not None:
            return
        try:
            found = self.store.read("isa", "probe", platform_fingerprint())
        except RefusedEntry as refused:
            log.warning("compile cache: refused the vector ISA probe (%s)", refused)
            return
        if found is None:
            return
        reported, working = json.loads(found[1])
        if reported == working == _reported_isas():
            trust_vector_isas()
            log.info("compile cache: vector ISAs %s probed by a former process; not probing again", working)

    def _holds_verified(self, kind: str, key: str, fingerprint: str) -> bool:
        """Whether the directory holds the entry and it passes its checks (a refused one is written again)."""
        try:
            return self.store.read(kind, key, fingerprint) is not None
        except RefusedEntry:
            return False


def _library_target(root: Path, name: object) -> Path | None:
    """Where the library ``name`` goes under ``root``; None for a name not of inductor's form."""
    if not isinstance(name, str) or LIBRARY_NAME.fullmatch(name) is None:
        return None
    target = root.joinpath(*name.split("/"))
    return target if target.parent.parent == root else None


def _is_x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def _reported_isas() -> list[str]:
    cpu_vec_isa = inductor_module("cpu_vec_isa")
    reported = cpu_vec_isa.x86_isa_checker()
    return [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list if all(f in reported for f in str(isa).split())]


def compiled_library_paths() -> dict[str, Path]:
    """The C++ libraries inductor built or loaded for this process's steps and kernels, and its
    vector-ISA probes' test libraries (built again in every process with an empty cache dir), by
    path under its cache dir."""
    root = Path(inductor_cache_dir())
    codecache = inductor_module("codecache")
    keys = {
        key
        for code_cache in (codecache.CppCodeCache, codecache.CppPythonBindingsCodeCache, codecache.CppWrapperCodeCache)
        for key in getattr(code_cache, "cache", {})
    }
    paths = [path for key in keys for path in (root / key[1:3]).glob(f"{key}.*")]
    paths += [source.with_suffix(".so") for source in _vector_isa_probe_sources(root)]
    found = {}
    for path in sorted(paths):
        name = path.relative_to(root).as_posix()
        if path.suffix in (".so", ".o") and path.is_file() and LIBRARY_NAME.fullmatch(name):
            found[name] = path
    return found


def _vector_isa_probe_sources(root: Path) -> list[Path]:
    """The sources inductor's vector-ISA probes wrote under ``root``: files holding one of their test programs."""
    classes, programs = [inductor_module("cpu_vec_isa").VecISA], set()
    while classes:
        isa = classes.pop()
        classes += isa.__subclasses__()
        programs |= {
            value.encode() for name, value in vars(isa).items() if name.endswith("_code") and isinstance(value, str)
        }
    sizes = {len(program) for program in programs}
    return [
        source for source in root.glob("??/*.cpp") if source.stat().st_size in sizes and source.read_bytes() in programs
    ]
