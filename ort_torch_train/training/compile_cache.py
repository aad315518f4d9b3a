"""torch.compile's caches carried across processes: one portable file saved next to the artifacts.

The file holds torch's FX-graph, AOTAutograd and inductor cache entries
(``torch.compiler.save_cache_artifacts``) and the train steps this process compiled, Dynamo's
tracing included (``precompiled.py``). Loading it (or finding no file yet) also switches precompiling
on, so that the steps compiled afterwards can be saved; a saved step loads instead of compiling.

    load_compile_cache("artifacts/compile.cache")   # before the first compiled step
    ...train with Module(..., compile=True)...
    save_compile_cache("artifacts/compile.cache")   # after it
"""

from __future__ import annotations

import logging
import os
import pickle
import platform

import torch

from ort_torch_train.errors import InputError
from ort_torch_train.fileio import atomic_write_bytes
from ort_torch_train.training import precompiled

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
        content = pickle.loads(data[len(_MAGIC):])
        version, artifacts, steps = content["torch"], content["artifacts"], content["steps"]
        if version != torch.__version__:
            log.warning("compile cache %s was written with torch %s, this is %s: compiling anew",
                        os.fspath(path), version, torch.__version__)
            return False
        if artifacts is not None and torch.compiler.load_cache_artifacts(artifacts) is None:
            raise ValueError("torch could not read its cache artifacts")
        _trust_vector_isa_probe(content.get("vec_isa"))
    except Exception as exc:
        raise InputError(f"compile cache {os.fspath(path)!r}: expected a file written by save_compile_cache "
                         f"with torch {torch.__version__}; could not load it ({exc})") from exc
    precompiled.enable(steps)
    return True


def save_compile_cache(path: str | os.PathLike) -> int:
    """Write what this process compiled so far to ``path`` (atomically); returns the bytes written (0: nothing)."""
    saved = torch.compiler.save_cache_artifacts()
    steps = precompiled.saved_steps()
    if saved is None and not steps:
        return 0
    content = {"torch": torch.__version__, "artifacts": None if saved is None else saved[0], "steps": steps,
               "vec_isa": _vector_isa_probe()}
    data = _MAGIC + pickle.dumps(content, protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write_bytes(path, data)
    return len(data)


def _vector_isa_probe() -> tuple[list[str], list[str]] | None:
    """The x86 vector ISAs this CPU reports and those inductor's probe (building and loading a test
    library in subprocesses, about a second per process) found working; None off x86."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    from torch._inductor import cpu_vec_isa

    return _reported_isas(), [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]


def _reported_isas() -> list[str]:
    from torch._inductor import cpu_vec_isa

    reported = cpu_vec_isa.x86_isa_checker()
    return [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list if all(f in reported for f in str(isa).split())]


def _trust_vector_isa_probe(saved: tuple[list[str], list[str]] | None) -> None:
    """Skip inductor's vector ISA probe when the saving process probed the same CPU's ISAs and found
    them all working (``cpp.vec_isa_ok``: the reported ISAs are taken as they are)."""
    from torch._inductor import config

    if saved is None or config.cpp.vec_isa_ok is not None:
        return
    reported, working = saved
    if platform.machine() in ("x86_64", "AMD64") and reported == working == _reported_isas():
        config.cpp.vec_isa_ok = True
        log.info("compile cache: vector ISAs %s probed by the saving process; not probing again", working)
