"""Typed keys for the facts one stage leaves in a torch.fx ``meta`` dict for a later stage to read.

A converted ``GraphModule`` and its ``Node``s each carry a ``meta`` dict. The conversion records facts
there (the matrix products of the graph, whether an input's example needed a gradient), the graph
rewrites count what they fused, and the training layer notes the axes compiled as dynamic. Each fact's
key is a ``MetaKey`` declared once, with the type of its value, in the package that owns the fact
(``convert/meta_keys.py``, ``passes/meta_keys.py``, ``training/meta_keys.py``): a misspelt key is a
NameError and a wrong value a type error, not a silent default. torch.fx's own entries (``val``,
``tensor_meta``) stay plain strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
D = TypeVar("D")


class HasMeta(Protocol):
    """What keeps a ``meta`` dict: torch.fx's ``GraphModule`` and ``Node``."""

    meta: dict[str, Any]


@dataclass(frozen=True)
class MetaKey(Generic[T]):
    """The entry ``name`` of a ``meta`` dict, whose value is a ``T``."""

    name: str

    def get(self, owner: HasMeta, default: D) -> T | D:
        """The value ``owner`` keeps under this key, or ``default`` where it keeps none."""
        return owner.meta.get(self.name, default)

    def set(self, owner: HasMeta, value: T) -> None:
        """Keep ``value`` in ``owner`` under this key (replacing any former one)."""
        owner.meta[self.name] = value

    def setdefault(self, owner: HasMeta, value: T) -> T:
        """The value ``owner`` keeps under this key, after keeping ``value`` there where it kept none."""
        return owner.meta.setdefault(self.name, value)

    def pop(self, owner: HasMeta, default: D) -> T | D:
        """The value ``owner`` kept under this key, now removed, or ``default`` where it kept none."""
        return owner.meta.pop(self.name, default)
