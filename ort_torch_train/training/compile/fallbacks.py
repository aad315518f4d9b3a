"""What a compiled step fell back to when torch.compile could not compile it as asked, remembered.

Two fallbacks: ``SPECIALISED``, the axes torch.compile specialised in a step of a graph marked dynamic
(remembered for the graph, whatever its conversion and its other dynamic axes: those axes are compiled
fixed from then on), and ``EAGER``, a step torch.compile cannot compile at all (run uncompiled,
remembered for the graph too: no new input size tries it again). Each is kept for this process and,
with a compile cache, in the cache (``CompileCache.save_fallback``), so that neither this process nor
the next tries that compilation again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.dynamic_shapes import Axis
from ort_torch_train.training.meta_keys import GRAPH_STRUCTURE

log = logging.getLogger(__name__)

SPECIALISED = "specialised axes"
EAGER = "eager"

_LITERAL = re.compile(r"(?<![\w.])\d+")  # an integer literal (not part of a name): it may hold a size
_NAME_COUNT = re.compile(r"_\d+\b")  # the count fx appends to a repeated name (size_1): it varies too
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MARKED_AXIS = re.compile(r"L\['inputs'\]\[(\d+)\]\.size\(\)\[(\d+)\]")  # how torch names a train step input's axis
_REMEMBERED: dict[tuple[str, str], str] = {}  # (kind, key) -> why (SPECIALISED: a Specialised as JSON)


@dataclass(frozen=True)
class Specialised:
    """The (input position, axis) pairs torch.compile specialised in a graph's compiled steps (None: it
    named none, so every axis), and torch's ``reason``."""

    axes: frozenset[Axis] | None
    reason: str

    def fixed(self, marked: Sequence[Axis]) -> tuple[Axis, ...]:
        """The axes of ``marked`` to compile fixed."""
        return tuple(marked) if self.axes is None else tuple(axis for axis in marked if axis in self.axes)


def code_digest(module: torch.nn.Module) -> str:
    """A digest of ``module``'s submodules and code with its integer literals left out (they hold the
    sizes it was converted for): the same for the conversions of one graph for other input sizes."""
    digest = hashlib.sha256()
    for name, submodule in module.named_modules():
        code = _LITERAL.sub("#", _NAME_COUNT.sub("", str(getattr(submodule, "code", ""))))
        digest.update(f"{name}:{type(submodule).__qualname__}:{code}".encode())
    return digest.hexdigest()


def structure_key(module: torch.nn.Module, parts: Sequence[object]) -> str:
    """The key the axes torch specialised in a step of ``module`` are remembered under: torch's version,
    the digest of the graph before its literals became expressions of the dynamic sizes (its
    ``GRAPH_STRUCTURE``; else ``code_digest`` of ``module``) and the step's ``parts``. Shared by every
    conversion of one graph, whatever its input sizes and whichever of its axes are dynamic."""
    digest = hashlib.sha256(torch.__version__.encode())
    structure = GRAPH_STRUCTURE.get(module, None) if isinstance(module, fx.GraphModule) else None
    digest.update((structure or code_digest(module)).encode())
    for part in parts:
        digest.update(_ADDRESS.sub("", repr(part)).encode())
    return digest.hexdigest()


def specialised_axes(error: BaseException, marked: Sequence[Axis]) -> frozenset[Axis] | None:
    """The axes of ``marked`` that torch's ``error`` (or its causes) names; None where it names none."""
    named: set[Axis] = set()
    while error is not None:
        named.update((int(position), int(axis)) for position, axis in _MARKED_AXIS.findall(str(error)))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return frozenset(named & set(marked)) or None


def recalled_axes(key: str, cache: CompileCache | None) -> Specialised | None:
    """The axes torch specialised in a step of the graph under ``key`` (``structure_key``), in this
    process or (with a ``cache``) a process that saved them there; None when it specialised none."""
    text = recalled(SPECIALISED, key, cache)
    if text is None:
        return None
    try:
        found = json.loads(text)
        axes = None if found["axes"] is None else frozenset((int(p), int(a)) for p, a in found["axes"])
        return Specialised(axes, str(found["reason"]))
    except (ValueError, KeyError, TypeError) as error:
        log.warning("compile cache: ignored the specialised axes saved under %s (%s)", key[:12], error)
        return None


def remember_axes(key: str, specialised: Specialised, cache: CompileCache | None) -> Specialised:
    """Keep ``specialised`` for the graph under ``key``, with the axes remembered before; returns them all."""
    former = recalled_axes(key, cache)
    if former is not None:
        axes = None if former.axes is None or specialised.axes is None else former.axes | specialised.axes
        specialised = Specialised(axes, specialised.reason)
    listed = None if specialised.axes is None else sorted(specialised.axes)
    remember(SPECIALISED, key, json.dumps({"axes": listed, "reason": specialised.reason}), cache)
    return specialised


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
