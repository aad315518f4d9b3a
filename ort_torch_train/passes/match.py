"""Small matching helpers shared by the fusion passes."""

from __future__ import annotations

import torch
from torch import fx


def val(node) -> torch.Tensor | None:
    """The meta tensor (shape and dtype) the conversion recorded for ``node``, or None."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def is_call(node, target, arg_count: int | None = None) -> bool:
    """Whether ``node`` calls ``target`` (a function, or a method name) without kwargs."""
    op = "call_method" if isinstance(target, str) else "call_function"
    return (
        isinstance(node, fx.Node)
        and node.op == op
        and node.target == target
        and not node.kwargs
        and (arg_count is None or len(node.args) == arg_count)
    )


def only_user(node: fx.Node) -> fx.Node | None:
    """The single reader of ``node``, or None."""
    return next(iter(node.users)) if len(node.users) == 1 else None
