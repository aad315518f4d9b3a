"""The integer literals in which two converted graphs differ, and the rewrite of one of them into an
expression: the comparison behind dynamic shapes (``dynamic_shapes.py``).

Besides literals, three kinds of constant tensors may differ by a length: one that counts up along one
axis (position ids folded from ``arange(length)``), recorded at the path ``COUNT_LENGTH``; a grid, an
integer tensor that is an affine function of its indices or a tensor of one value (token-type ids
expanded to batch x length, the flat indices of a batch x length mask, an MoE layer's zeros) or a relative
table, an integer tensor whose last two axes (query, key) hold a piecewise affine function of the key's
offset from the query (T5's distances behind its relative-position buckets), or stacked grids (the index
tuples of a GatherND, each entry a grid), whose sizes and steps are
recorded at ``(GRID, "size" | "step", axis)``; and a table whose rows at a shorter length are its first
rows (rotary cos/sin tables, causal masks), recorded at ``(PREFIX, axes)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

Place = tuple[int, tuple[Any, ...]]  # (node position, path into its (args, kwargs))
COUNT_LENGTH = ("count length",)  # the path of a counting constant's length
PREFIX = "prefix"  # (PREFIX, axes): the path of a prefix table's length along ``axes``
GRID = "grid"  # (GRID, "size" | "step", axis): the path of a grid's size or step along ``axis``
_MOST_COORDINATES = 8  # stacked grids: the most index tuples' entries along their last axis


def literal_differences(base: fx.GraphModule, probe: fx.GraphModule) -> dict[Place, tuple[int, int]] | str:
    """The integer literals in which ``probe`` differs from ``base``, by place; a text naming the
    first other difference instead."""
    base_nodes, probe_nodes = list(base.graph.nodes), list(probe.graph.nodes)
    if len(base_nodes) != len(probe_nodes):
        return "the graph's node count"
    found: dict[Place, tuple[int, int]] = {}
    for position, (a, b) in enumerate(zip(base_nodes, probe_nodes)):
        if a.op != b.op or a.target != b.target or a.name != b.name:
            return f"the graph's node {a.name!r}"
        if not _compare((a.args, a.kwargs), (b.args, b.kwargs), position, (), found):
            return f"an argument of node {a.name!r}"
        if a.op == "get_attr" and not _same_state(attribute(base, a.target), attribute(probe, b.target)):
            differences = _table_differences(attribute(base, a.target), attribute(probe, b.target))
            if differences is None:
                return f"the constant {a.target!r}"
            found.update(((position, path), values) for path, values in differences.items())
        if a.op == "call_module" and not _same_state(base.get_submodule(a.target), probe.get_submodule(b.target)):
            return f"the settings of node {a.name!r}"
    return found


def _compare(a: Any, b: Any, position: int, path: tuple, found: dict[Place, tuple[int, int]]) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, fx.Node):
        return a.name == b.name
    if isinstance(a, int) and not isinstance(a, bool):
        if a != b:
            found[(position, path)] = (a, b)
        return True
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(
            _compare(x, y, position, (*path, i), found) for i, (x, y) in enumerate(zip(a, b))
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_compare(a[k], b[k], position, (*path, k), found) for k in a)
    if isinstance(a, slice):
        parts = ("start", "stop", "step")
        return all(_compare(getattr(a, p), getattr(b, p), position, (*path, p), found) for p in parts)
    if isinstance(a, torch.Tensor):
        return _same_state(a, b)
    return a == b


def replaced(value: Any, path: tuple, new: fx.Node) -> Any:
    """``value`` (nested args and kwargs) with the item at ``path`` replaced by ``new``."""
    if not path:
        return new
    key, rest = path[0], path[1:]
    if isinstance(value, slice):
        parts = {p: getattr(value, p) for p in ("start", "stop", "step")}
        parts[key] = replaced(parts[key], rest, new)
        return slice(parts["start"], parts["stop"], parts["step"])
    if isinstance(value, dict):
        return {**value, key: replaced(value[key], rest, new)}
    items = list(value)
    items[key] = replaced(items[key], rest, new)
    return type(value)(items) if isinstance(value, (tuple, list)) else items


def counting_like(graph: fx.Graph, constant: torch.Tensor, length: fx.Node) -> fx.Node:
    """Nodes computing ``constant``, which counts up along one axis, at ``length`` along that axis."""
    axis = _counting_axis(constant)
    assert axis is not None
    counted = graph.call_function(torch.arange, (length,), {"dtype": constant.dtype, "device": constant.device})
    first = int(constant.flatten()[0])
    if first:
        counted = graph.call_function(torch.add, (counted, first))
    shape = tuple(length if dim == axis else 1 for dim in range(constant.dim()))
    return graph.call_method("reshape", (counted, shape))


def prefix_of(graph: fx.Graph, table: fx.Node, axes: tuple[int, ...], length: fx.Node) -> fx.Node:
    """Nodes cutting the constant ``table`` to ``length`` along ``axes``: a narrow of the first axis, an
    index_select of the others (a narrowed inner axis is a view whose layout torch decides by comparing
    ``length`` with the table's size, which fixes a dynamic length to it)."""
    cut = table
    for axis in axes:
        if axis == 0:
            cut = graph.call_method("narrow", (cut, axis, 0, length))
        else:
            device = graph.call_function(getattr, (table, "device"))
            positions = graph.call_function(torch.arange, (length,), {"device": device})
            cut = graph.call_function(torch.index_select, (cut, axis, positions))
    return cut


def _table_differences(a: Any, b: Any) -> dict[tuple, tuple[int, int]] | None:
    """The paths and the lengths by which constant ``b`` differs from ``a`` (tensors of one dtype and rank):
    a counting constant's, a grid's sizes and steps, or a table's that ``b`` is the first rows of; else None."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.dim() != b.dim():
        return None
    lengths = _count_lengths(a, b)
    if lengths is not None:
        return {COUNT_LENGTH: lengths}
    grid_a, grid_b = grid_of(a), grid_of(b)
    if grid_a is not None and grid_b is not None and grid_a[0] == grid_b[0]:
        steps = (grid_a[1], grid_b[1])
    elif grid_a is None and grid_b is None and _fixed_steps(a) is not None and _fixed_steps(a) == _fixed_steps(b):
        steps = ((), ())  # a relative table's or stacked grids' steps do not change with their sizes
    else:
        steps = None
    if steps is not None:
        return {
            (GRID, part, axis): (x, y)
            for part, (of_a, of_b) in (("size", (a.shape, b.shape)), ("step", steps))
            for axis, (x, y) in enumerate(zip(of_a, of_b))
            if x != y
        }
    axes = _prefix_axes(a, b)
    if axes is not None:
        return {(PREFIX, axes): (a.shape[axes[0]], b.shape[axes[0]])}
    return None


def grid_of(tensor: torch.Tensor) -> tuple[Any, tuple[int, ...]] | None:
    """``(start, steps)`` of a tensor whose element at ``index`` is ``start + sum(steps * index)``: an
    integer tensor affine in its indices, or a tensor of one value (steps 0: a float one is the zeros a
    Mixture-of-Experts layer adds its routed tokens to); else None."""
    flat = tensor.detach().cpu()
    if flat.numel() < 2 or flat.is_complex():
        return None
    start = flat.flatten()[0]
    if bool((flat == start).all()):
        return start.item(), (0,) * flat.dim()
    if flat.dtype == torch.bool or flat.dtype.is_floating_point:
        return None
    steps = tuple(
        int(flat.select(axis, 1).flatten()[0] - start) if size > 1 else 0 for axis, size in enumerate(flat.shape)
    )
    if not torch.equal(flat, _grid_values(int(start), steps, flat.shape, flat.dtype)):
        return None
    return int(start), steps


def _grid_values(start: int, steps: tuple[int, ...], shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    values = torch.full(shape, start, dtype=dtype)
    for axis, step in enumerate(steps):
        view = [1] * len(shape)
        view[axis] = shape[axis]
        values = values + (torch.arange(shape[axis], dtype=dtype) * step).reshape(view)
    return values


def grid_like(graph: fx.Graph, constant: torch.Tensor, parts: dict[tuple[str, int], Any]) -> fx.Node:
    """Nodes computing the grid ``constant`` (``grid_of``) with the sizes and steps in ``parts``
    (("size" | "step", axis) -> a node or an int; the constant's own where absent)."""
    shape = tuple(parts.get(("size", axis), size) for axis, size in enumerate(constant.shape))
    place: dict[str, fx.node.Argument] = {"dtype": constant.dtype, "device": constant.device}
    found = grid_of(constant)
    if found is None and stacked_grids(constant) is not None:
        slices = [grid_like(graph, constant.select(-1, k), parts) for k in range(constant.shape[-1])]
        return graph.call_function(torch.stack, (slices, -1))
    if found is None:
        return _relative_like(graph, constant, shape, place)
    start, steps = found
    if constant.dtype.is_floating_point:  # one value (an accumulator of routed tokens): filled, not a view
        return graph.call_function(torch.full, (shape, start), place)
    values = graph.call_function(torch.full, ((1,) * constant.dim(), start), place)
    for axis, step in enumerate(steps):
        step = parts.get(("step", axis), step)
        if isinstance(step, int) and step == 0:
            continue
        counted = graph.call_function(torch.arange, (shape[axis],), place)
        view = tuple(shape[axis] if k == axis else 1 for k in range(constant.dim()))
        counted = graph.call_method("reshape", (graph.call_function(torch.mul, (counted, step)), view))
        values = graph.call_function(torch.add, (values, counted))
    return graph.call_method("expand", (values, shape))


def stacked_grids(tensor: torch.Tensor) -> tuple[tuple[Any, tuple[int, ...]], ...] | None:
    """``grid_of`` of each slice along the last axis of an integer tensor whose every such slice is a grid
    and not all of it one (GatherND's index tuples over a batch x length grid); else None."""
    if tensor.dim() < 2 or not 2 <= tensor.shape[-1] <= _MOST_COORDINATES or tensor.dtype.is_floating_point:
        return None
    if tensor.is_complex() or tensor.dtype == torch.bool:
        return None
    grids = tuple(grid_of(tensor.select(-1, k)) for k in range(tensor.shape[-1]))
    return None if any(grid is None for grid in grids) else grids  # type: ignore[return-value]


def _fixed_steps(tensor: torch.Tensor) -> tuple[str, Any] | None:
    """What stays of a table with steps that do not follow its sizes (a relative table, stacked grids)."""
    relative = relative_of(tensor)
    if relative is not None:
        return "relative", relative
    stacked = stacked_grids(tensor)
    return None if stacked is None else ("stacked", stacked)


def relative_of(tensor: torch.Tensor) -> tuple[int, int, int] | None:
    """``(start, up, down)`` of an integer tensor whose element at (..., i, j) is ``start + up * max(j - i, 0)
    + down * max(i - j, 0)`` (its leading axes of size 1, its last two of size 2 or more); else None."""
    if tensor.dim() < 2 or tensor.dtype.is_floating_point or tensor.is_complex() or tensor.dtype == torch.bool:
        return None
    if any(size != 1 for size in tensor.shape[:-2]) or min(tensor.shape[-2:]) < 2:
        return None
    table = tensor.detach().cpu().reshape(tensor.shape[-2:])
    start, up, down = int(table[0, 0]), int(table[0, 1] - table[0, 0]), int(table[1, 0] - table[0, 0])
    return (start, up, down) if torch.equal(table, _relative_values(start, up, down, *table.shape)) else None


def _relative_values(start: int, up: int, down: int, queries: Any, keys: Any, **place: Any) -> torch.Tensor:
    offsets = torch.arange(keys, **place).reshape(1, keys) - torch.arange(queries, **place).reshape(queries, 1)
    return start + up * offsets.clamp(min=0) + down * (-offsets).clamp(min=0)


def _relative_like(
    graph: fx.Graph, constant: torch.Tensor, shape: tuple[Any, ...], place: dict[str, fx.node.Argument]
) -> fx.Node:
    """Nodes computing the relative table ``constant`` (``relative_of``) at ``shape``."""
    found = relative_of(constant)
    assert found is not None
    table = graph.call_function(_relative_values, (*found, shape[-2], shape[-1]), place)
    return graph.call_method("reshape", (table, shape))


def _prefix_axes(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...] | None:
    """The axes along which ``b`` is ``a`` cut shorter, all to one length, if it is."""
    axes = tuple(axis for axis in range(a.dim()) if a.shape[axis] != b.shape[axis])
    if not axes or any((a.shape[axis], b.shape[axis]) != (a.shape[axes[0]], b.shape[axes[0]]) for axis in axes):
        return None
    if b.shape[axes[0]] > a.shape[axes[0]]:
        return None
    cut = a.detach().cpu()
    for axis in axes:
        cut = cut.narrow(axis, 0, b.shape[axis])
    return axes if torch.equal(cut, b.detach().cpu()) else None


def _count_lengths(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int] | None:
    """The lengths of two constants that count up from one value along one axis, else None."""
    axis = _counting_axis(a)
    if axis is None or axis != _counting_axis(b) or a.flatten()[0] != b.flatten()[0]:
        return None
    return a.shape[axis], b.shape[axis]


def _counting_axis(tensor: torch.Tensor) -> int | None:
    """The axis along which an integer ``tensor`` counts up by one (every other axis of size 1), if any."""
    long = [axis for axis, size in enumerate(tensor.shape) if size != 1]
    if tensor.dtype.is_floating_point or tensor.is_complex() or tensor.dtype == torch.bool or len(long) != 1:
        return None
    flat = tensor.detach().flatten().cpu()
    return long[0] if torch.equal(flat, torch.arange(flat.numel(), dtype=flat.dtype) + flat[0]) else None


def attribute(module: torch.nn.Module, target: str) -> Any:
    owner, _, name = target.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, name)


def _same_state(a: Any, b: Any) -> bool:
    """Whether two constants, or two submodules (types, code, settings and tensors, nested ones' too), are alike."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a.detach().cpu(), b.detach().cpu()))
        )
    if not isinstance(a, torch.nn.Module) or not isinstance(b, torch.nn.Module):
        return _same_settings(a, b)
    modules_a, modules_b = list(a.named_modules()), list(b.named_modules())
    if [name for name, _ in modules_a] != [name for name, _ in modules_b]:
        return False
    return all(_same_module(x, y) for (_, x), (_, y) in zip(modules_a, modules_b))


def _same_module(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """One module's own type, code, settings and tensors (not its children's)."""
    if type(a) is not type(b) or (isinstance(a, fx.GraphModule) and a.code != b.code):
        return False
    settings_a, settings_b = _settings(a), _settings(b)
    tensors_a = dict(a.named_buffers(recurse=False)) | dict(a.named_parameters(recurse=False))
    tensors_b = dict(b.named_buffers(recurse=False)) | dict(b.named_parameters(recurse=False))
    return (
        settings_a.keys() == settings_b.keys()
        and all(_same_settings(settings_a[k], settings_b[k]) for k in settings_a)
        and tensors_a.keys() == tensors_b.keys()
        and all(_same_state(tensors_a[k], tensors_b[k]) for k in tensors_a)
    )


def _settings(module: torch.nn.Module) -> dict[str, Any]:
    skipped = ("_modules", "_parameters", "_buffers", "meta", "_graph", "_code", "training")
    return {k: v for k, v in vars(module).items() if k not in skipped and "hook" not in k and not callable(v)}


def _same_settings(a: Any, b: Any) -> bool:
    found: dict[Place, tuple[int, int]] = {}
    try:
        return _compare(a, b, 0, (), found) and not found
    except Exception:  # values without a comparison of their own
        return repr(a) == repr(b)
