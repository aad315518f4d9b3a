"""torch.compile's caches carried across processes: one portable file saved next to the artifacts.

The file holds torch's FX-graph, AOTAutograd and inductor cache entries
(``torch.compiler.save_cache_artifacts``), the train steps this process compiled, Dynamo's tracing
included (``precompiled.py``), and the C++ libraries inductor built for them, which torch's cache
entries do not carry: loaded into an empty inductor cache dir (a new container, a rebooted machine's
fresh /tmp), they spare the g++ builds when the platform matches. Loading it (or finding no file yet)
also switches precompiling on, so that the steps compiled afterwards can be saved; a saved step loads
instead of compiling. A cache file holds pickled objects and native code: load only files you trust,
as with ``torch.load(weights_only=False)``.

    load_compile_cache("artifacts/compile.cache")   # before the first compiled step
    ...train with Module(..., compile=True)...
    save_compile_cache("artifacts/compile.cache")   # after it
"""

from __future__ import annotations

import logging
import os
import pickle
import platform
import sys
from pathlib import Path, PurePosixPath

import torch

from ort_torch_train.errors import InputError
from ort_torch_train.fileio import atomic_write_bytes
from ort_torch_train.torch_internals import codecache, cpu_features, cpu_vec_isa, inductor_cache_dir, inductor_config
from ort_torch_train.training.compile import precompiled

log = logging.getLogger(__name__)
_MAGIC = b"ort-torch-train compile cache 2\n"


def load_compile_cache(path: str | os.PathLike) -> bool:
    """Preload the compile caches saved in ``path`` and precompile from now on; False when there is no
    such file yet, or it was written by another torch version (then it is ignored, with a log line)."""
    precompiled.enable({})
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return False
    try:
        if not data.startswith(_MAGIC):
            raise ValueError(f"it does not start with {_MAGIC!r}")
        content = pickle.loads(data[len(_MAGIC) :])
        version, artifacts, steps = content["torch"], content["artifacts"], content["steps"]
        if version != torch.__version__:
            log.warning(
                "compile cache %s was written with torch %s, this is %s: compiling anew",
                os.fspath(path),
                version,
                torch.__version__,
            )
            return False
        if artifacts is not None and torch.compiler.load_cache_artifacts(artifacts) is None:
            raise ValueError("torch could not read its cache artifacts")
        _trust_vector_isa_probe(content.get("vec_isa"))
        _restore_libraries(content.get("libraries"))
    except Exception as exc:
        raise InputError(
            f"compile cache {os.fspath(path)!r}: expected a file written by save_compile_cache "
            f"with torch {torch.__version__}; could not load it ({exc})"
        ) from exc
    precompiled.enable(steps)
    return True


def save_compile_cache(path: str | os.PathLike) -> int:
    """Write what this process compiled so far to ``path`` (atomically); returns the bytes written (0: nothing)."""
    saved = torch.compiler.save_cache_artifacts()
    steps = precompiled.saved_steps()
    if saved is None and not steps:
        return 0
    content = {
        "torch": torch.__version__,
        "artifacts": None if saved is None else saved[0],
        "steps": steps,
        "vec_isa": _vector_isa_probe(),
        "libraries": (_library_platform(), _compiled_libraries()),
    }
    data = _MAGIC + pickle.dumps(content, protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write_bytes(path, data)
    return len(data)


def _vector_isa_probe() -> tuple[list[str], list[str]] | None:
    """The x86 vector ISAs this CPU reports and those inductor's probe (building and loading a test
    library in subprocesses) found working; None off x86."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    return _reported_isas(), [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]


def _reported_isas() -> list[str]:
    reported = cpu_vec_isa.x86_isa_checker()
    return [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list if all(f in reported for f in str(isa).split())]


def _trust_vector_isa_probe(saved: tuple[list[str], list[str]] | None) -> None:
    """Skip inductor's vector ISA probe when the saving process probed the same CPU's ISAs and found
    them all working (``cpp.vec_isa_ok``: the reported ISAs are taken as they are)."""
    if saved is None or inductor_config.cpp.vec_isa_ok is not None:
        return
    reported, working = saved
    if platform.machine() in ("x86_64", "AMD64") and reported == working == _reported_isas():
        inductor_config.cpp.vec_isa_ok = True
        log.info("compile cache: vector ISAs %s probed by the saving process; not probing again", working)


def _library_platform() -> tuple[object, ...]:
    """What loading a compiled library depends on besides torch: Python, OS, C library, CPU features."""
    return sys.implementation.cache_tag, platform.system(), platform.machine(), platform.libc_ver(), cpu_features()


def _compiled_libraries() -> dict[str, bytes]:
    """The C++ libraries inductor built or loaded for this process's steps and kernels, and its vector-ISA
    probes' test libraries (built again in every process with an empty cache dir), by path under its cache dir."""
    root = Path(inductor_cache_dir())
    keys = {
        key
        for code_cache in (codecache.CppCodeCache, codecache.CppPythonBindingsCodeCache, codecache.CppWrapperCodeCache)
        for key in getattr(code_cache, "cache", {})
    }
    paths = [path for key in keys for path in (root / key[1:3]).glob(f"{key}.*")]
    paths += [source.with_suffix(".so") for source in _vector_isa_probe_sources(root)]
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(paths)
        if path.suffix in (".so", ".o") and path.is_file()
    }


def _vector_isa_probe_sources(root: Path) -> list[Path]:
    """The sources inductor's vector-ISA probes wrote under ``root``: files holding one of their test programs."""
    classes, programs = [cpu_vec_isa.VecISA], set()
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


def _restore_libraries(saved: tuple[tuple[object, ...], dict[str, bytes]] | None) -> None:
    """Write the saved libraries that the inductor cache dir lacks, where they were built on this platform."""
    if not saved:
        return
    built_on, libraries = saved
    here = _library_platform()
    if built_on != here:
        log.info(
            "compile cache: its compiled libraries were built on %s, this is %s; building them anew", built_on, here
        )
        return
    root = Path(inductor_cache_dir())
    restored = 0
    for name, data in libraries.items():
        parts = PurePosixPath(name).parts
        if len(parts) != 2 or any(part in (".", "..") for part in parts) or "\\" in name:
            raise ValueError(f"compiled library path {name!r} is not of the form <dir>/<file>")
        target = root.joinpath(*parts)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)
            restored += 1
    if restored:
        log.info("compile cache: restored %d compiled libraries into %s", restored, root)
