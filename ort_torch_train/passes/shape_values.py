"""Shape arithmetic as Python integers in compiled graphs, so that data-dependent sizes stay symbolic.

An exported graph computes the shapes it reshapes, expands, fills and slices to with tensor ops on
``Shape`` outputs (Shape -> Slice -> Add -> Div -> Concat -> Reshape). Where a size is not known at
conversion (the tokens a Mixture-of-Experts layer routes to one expert: a NonZero's count), those ops
run in the graph, and torch.compile reading their result back (``.tolist()``) gets values unrelated to
the sizes they came from: every later comparison is a data-dependent guard it cannot make.
``shape_arithmetic_as_ints`` computes such chains on the sizes themselves (Python lists of torch's
symbolic sizes), for the run-time Reshape, Expand, ConstantOfShape, Tile and Slice that read them,
and hands those ops the integer constants of the graph as literals (a constant read as a tensor
while tracing is a data-dependent value too). The tensor ops stay for any other reader.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ort_torch_train.adapters import constants, elementwise, indexing, shape_ops
from ort_torch_train.adapters.common import if_else
from ort_torch_train.passes.match import get_attr_target

Values = list | int  # a 1-d shape tensor as a list of sizes, a 0-d one as a size

# functions that read shape tensors, and the positions where they do
CONSUMERS: dict[Callable[..., Any], tuple[int, ...]] = {
    shape_ops.reshape_dynamic: (1,),
    shape_ops.expand_dynamic: (1,),
    shape_ops.tile_dynamic: (1,),
    constants.constant_of_shape: (0,),
    indexing.dynamic_slice: (1, 2),
}
_LITERAL_LIMIT = 64  # integer constants up to this many elements become literals


def shape_values(x: torch.Tensor, start: int, end: int | None) -> list:
    """``x.shape[start:end]`` as a list (ONNX Shape)."""
    return list(x.shape[start:end])


def size_value(x: torch.Tensor) -> int:
    """``x``'s element count (ONNX Size)."""
    return x.numel()


def narrowed(values: list, start: int, length: int) -> list:
    """``values[start:start + length]`` (a Slice or Gather of a shape's entries)."""
    return values[start : start + length]


def selected(values: list, index: int) -> int:
    """One entry."""
    return values[index]


def as_list(value: int) -> list:
    """A size as a one-entry list (Unsqueeze)."""
    return [value]


def only_entry(values: list) -> int:
    """The entry of a one-entry list (Squeeze)."""
    return values[0]


def joined(*parts: list) -> list:
    """Lists one after the other (Concat)."""
    return [value for part in parts for value in part]


def truncated_quotient(a: Any, b: Any) -> Any:
    """``a / b`` rounded toward zero, as ONNX Div of integers; a zero divisor divides by 1, as
    ``elementwise.truncating_div`` does. Decides nothing on symbolic sizes (``torch.sym_*``)."""
    b = if_else(b == 0, 1, b)
    quotient = _magnitude(a) // _magnitude(b)
    return if_else((a < 0) == (b < 0), quotient, -quotient)


def _magnitude(value: Any) -> Any:
    return if_else(value < 0, -value, value)


_OPERATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": truncated_quotient,
}
_NAMES: dict[Any, str] = {torch.add: "add", torch.sub: "sub", torch.mul: "mul", elementwise.truncating_div: "div"}


def entrywise(name: str, a: Values, b: Values) -> Values:
    """The operation ``name`` (add, sub, mul, div) on each entry of ``a`` and ``b``, broadcast as numpy
    does for 0-d and 1-entry operands."""
    operation = _OPERATIONS[name]
    if isinstance(a, int | torch.SymInt) and isinstance(b, int | torch.SymInt):
        return operation(a, b)
    first = a if isinstance(a, list) else [a]
    second = b if isinstance(b, list) else [b]
    if len(first) == 1 and len(second) != 1:
        first = first * len(second)
    if len(second) == 1 and len(first) != 1:
        second = second * len(first)
    return [operation(x, y) for x, y in zip(first, second, strict=True)]


def _integer_constant(module: fx.GraphModule, node: fx.Node) -> Values | None:
    """The value of a small integer constant read by a ``get_attr`` node, as a list or an int."""
    if node.op != "get_attr":
        return None
    try:
        tensor = module.get_buffer(get_attr_target(node))
    except AttributeError:
        return None
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        return None
    if tensor.dim() > 1 or tensor.numel() > _LITERAL_LIMIT:
        return None
    return [int(v) for v in tensor.tolist()] if tensor.dim() == 1 else int(tensor.item())


class _Rewriter:
    """Builds, beside each shape-arithmetic node, a node computing the same on Python sizes."""

    def __init__(self, module: fx.GraphModule) -> None:
        self.module, self.graph = module, module.graph
        self.found: dict[fx.Node, tuple[Any, int]] = {}  # node -> (its list form: a node or a literal, rank)

    def operand(self, arg: Any) -> tuple[Any, int] | None:
        """An argument's list form and rank, or None where it has none."""
        if isinstance(arg, fx.Node):
            if arg in self.found:
                return self.found[arg]
            value = _integer_constant(self.module, arg)
            return None if value is None else (value, 1 if isinstance(value, list) else 0)
        if isinstance(arg, int) and not isinstance(arg, bool):
            return arg, 0
        return None

    def rewrite(self, node: fx.Node) -> None:
        form = self._form(node)
        if form is not None:
            (function, args), rank = form
            with self.graph.inserting_after(node):
                self.found[node] = (self.graph.call_function(function, tuple(args)), rank)

    def _form(self, node: fx.Node) -> tuple[tuple[Callable, list], int] | None:
        target, args = node.target, list(node.args)
        if node.op == "call_function" and target is shape_ops.shape_of:
            return (shape_values, args), 1
        if node.op == "call_function" and target is shape_ops.size_of:
            return (size_value, args), 0
        if not args or node.kwargs and target is not indexing.concat:
            return None
        if node.op == "call_function" and target is indexing.concat and node.kwargs == {"axis": 0}:
            parts = [self.operand(arg) for arg in args]
            if all(part is not None and part[1] == 1 for part in parts):
                return (joined, [part[0] for part in parts if part is not None]), 1
            return None
        first = self.operand(args[0])
        if first is None:
            return None
        if node.op == "call_method" and target == "narrow" and first[1] == 1 and args[1:2] == [0]:
            return (narrowed, [first[0], *args[2:]]), 1
        if node.op == "call_method" and target == "to" and _integer_dtype(args[1:]):
            return (_same, [first[0]]), first[1]
        if (
            node.op == "call_function"
            and target in (torch.select, indexing.select_one)
            and first[1] == 1
            and args[1] == 0
        ):
            return (selected, [first[0], args[2]]), 0
        if node.op == "call_function" and target is torch.unsqueeze and first[1] == 0 and args[1] in (0, -1, (0,)):
            return (as_list, [first[0]]), 1
        if node.op == "call_function" and target is torch.squeeze and first[1] == 1 and args[1:] in ([0], [(0,)], []):
            return (only_entry, [first[0]]), 0
        if node.op == "call_function" and target in _NAMES and len(args) == 2:
            second = self.operand(args[1])
            if second is not None:
                return (entrywise, [_NAMES[target], first[0], second[0]]), max(first[1], second[1])
        return None


def _same(value: Values) -> Values:
    """The value itself (a Cast between integer types)."""
    return value


def _integer_dtype(rest: list) -> bool:
    return len(rest) == 1 and rest[0] in (torch.int64, torch.int32)


def shape_arithmetic_as_ints(module: fx.GraphModule, device: torch.device) -> None:
    """Rewrite ``module``'s run-time Reshape/Expand/ConstantOfShape/Tile/Slice to read shapes computed
    on Python sizes, and integer constants as literals, where the graph's shape arithmetic allows."""
    rewriter = _Rewriter(module)
    for node in list(module.graph.nodes):
        if node.op in ("call_function", "call_method"):
            rewriter.rewrite(node)
    changed = False
    for node in list(module.graph.nodes):
        positions = CONSUMERS.get(node.target) if node.op == "call_function" else None
        for position in positions or ():
            if position < len(node.args):
                found = rewriter.operand(node.args[position])
                if found is not None and found[1] == 1:
                    node.update_arg(position, found[0])
                    changed = True
    if rewriter.found or changed:
        module.graph.eliminate_dead_code()
        module.graph.lint()
