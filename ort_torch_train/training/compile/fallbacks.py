"""What a compiled step fell back to when torch.compile could not compile it, remembered by step key.

Two fallbacks: ``FIXED``, a step whose dynamic axes torch.compile specialised (compiled again for fixed
shapes), and ``EAGER``, a step torch.compile cannot compile at all (run uncompiled). Each is kept for
this process and, with a compile cache, in the cache (``CompileCache.save_fallback``), so that neither
this process nor the next tries that compilation again.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence

import torch

from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.precompiled import step_key

log = logging.getLogger(__name__)

FIXED = "fixed shapes"
EAGER = "eager"

_LITERAL = re.compile(r"(?<![\w.])\d+")  # an integer literal (not part of a name): it may hold a size
_NAME_COUNT = re.compile(r"_\d+\b")  # the count fx appends to a repeated name (size_1): it varies too
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_REMEMBERED: dict[tuple[str, str], str] = {}  # (kind, step key) -> why


def fallback_key(
    module: torch.nn.Module, parts: Sequence[object], args: tuple, dynamic: Sequence[tuple[int, int]]
) -> str:
    """The key a fallback of the step for ``args`` (its ``dynamic`` axes marked) is remembered under."""
    return step_key(module, parts, args, dynamic)


def structure_key(module: torch.nn.Module, parts: Sequence[object], dynamic: Sequence[tuple[int, int]]) -> str:
    """A key shared by the conversions of one graph for other sizes of its fixed axes: torch's version,
    the module's submodules and code with its integer literals left out (they hold those sizes),
    ``parts`` and the ``dynamic`` axes. Where torch specialised those axes for one such size, it
    specialises them for the others."""
    digest = hashlib.sha256(torch.__version__.encode())
    for name, submodule in module.named_modules():
        code = _LITERAL.sub("#", _NAME_COUNT.sub("", str(getattr(submodule, "code", ""))))
        digest.update(f"{name}:{type(submodule).__qualname__}:{code}".encode())
    for part in parts:
        digest.update(_ADDRESS.sub("", repr(part)).encode())
    digest.update(repr(sorted(dynamic)).encode())
    return digest.hexdigest()


def recalled(kind: str, key: str, cache: CompileCache | None) -> str | None:
    """Why the step under ``key`` fell back to ``kind`` before, in this process or (with a ``cache``) a
    process that saved it there; None when it did not."""
    reason = _REMEMBERED.get((kind, key))
    if reason is None and cache is not None:
        reason = cache.load_fallback(kind, key)
        if reason is not None:
            _REMEMBERED[(kind, key)] = reason
    return reason


def remember(kind: str, key: str, reason: str, cache: CompileCache | None) -> None:
    """Keep that the step under ``key`` falls back to ``kind`` because of ``reason``."""
    _REMEMBERED[(kind, key)] = reason
    if cache is not None:
        cache.save_fallback(kind, key, reason)
