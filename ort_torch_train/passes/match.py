"""Small matching helpers shared by the graph passes.

fx types a node's arguments as the union of every kind an argument may be; the passes check each
argument's kind as they match (``is_call``, ``isinstance``), so ``args_of`` hands them out untyped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import torch
from torch import fx, nn


def val(node: object) -> torch.Tensor | None:
    """The meta tensor (shape and dtype) the conversion recorded for ``node``, or None."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def known_val(node: object) -> torch.Tensor:
    """The meta tensor of a node a pass has matched as having one."""
    value = val(node)
    if value is None:
        raise ValueError(f"{node} has no meta value")
    return value


def args_of(node: fx.Node) -> tuple[Any, ...]:
    """``node``'s positional arguments, for matching."""
    return node.args


def kwargs_of(node: fx.Node) -> dict[str, Any]:
    """``node``'s keyword arguments, for matching."""
    return dict(node.kwargs)


def replace_with_call(graph: fx.Graph, node: fx.Node, function: Callable[..., Any], args: tuple[Any, ...]) -> fx.Node:
    """``node`` replaced in ``graph`` by a call of ``function`` on ``args`` that takes over its meta and uses."""
    with graph.inserting_before(node):
        call = graph.call_function(function, args)
    call.meta.update(node.meta)
    node.replace_all_uses_with(call)
    graph.erase_node(node)
    return call


def is_call(node: object, target: Callable[..., Any] | str, arg_count: int | None = None) -> TypeGuard[fx.Node]:
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


def constants_of(module: fx.GraphModule) -> nn.Module:
    """The submodule holding a converted graph's constant buffers."""
    return module.get_submodule("constants")


def get_attr_target(node: fx.Node) -> str:
    """The qualified attribute name a ``get_attr`` or ``call_module`` node reads."""
    return str(node.target)
