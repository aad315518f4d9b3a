"""Dynamic dimensions: one converted graph, compiled once, for every size along the axes inputs may vary.

The conversion (``convert/graph.py``) folds an exported graph's shape arithmetic into literals for
one input signature. To serve other sizes, the graph is converted once more per group of candidate
axes (axes the ONNX graph leaves symbolic, grouped by size: the batch axis of the inputs and of the
labels is one group), that group one longer. A literal that follows the group's size is rewritten as
an expression of the input's size (``c * x.size(axis)`` or ``x.size(axis) + c``), and the group's
axes compile as dynamic dimensions. A group stays fixed, with an INFO line naming why, when its
size reaches anything else: a constant tensor (a position table sliced to the sequence length), a
submodule's settings, the graph's structure. Sizes 0 and 1 always stay fixed: torch.compile
specialises them; so does torch.func.grad's linear of a 3-d input, which a dynamic graph runs over
its rows instead (``linear_over_rows``). Where torch.compile specialises a dynamic axis anyway, the
step compiles again for fixed shapes, with an INFO line (``compile/step.py``).
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.errors import InputError
from ort_torch_train.passes.onednn_linear import LINEARS
from ort_torch_train.torch_internals import mark_dynamic

log = logging.getLogger(__name__)

Axis = tuple[int, int]  # (user input position, axis)
Group = tuple[Axis, ...]  # axes that take one size together
DynamicSetting = bool | Mapping[str, Sequence[int]]
Place = tuple[int, tuple[Any, ...]]  # (node position, path into its (args, kwargs))


def dynamic_setting(dynamic: DynamicSetting) -> bool | dict[str, tuple[int, ...]]:
    """The checked ``dynamic`` argument: a bool, or the axes that may vary by input name."""
    if isinstance(dynamic, bool):
        return dynamic
    if isinstance(dynamic, Mapping) and all(
        isinstance(name, str)
        and isinstance(axes, (list, tuple))
        and all(isinstance(axis, int) and not isinstance(axis, bool) for axis in axes)
        for name, axes in dynamic.items()
    ):
        return {name: tuple(axes) for name, axes in dynamic.items()}
    raise ValueError(f"dynamic: expected a bool or a dict of input name -> list of axes; got {dynamic!r}")


def check_requested_axes(
    setting: bool | Mapping[str, Sequence[int]], declared: Sequence[tuple[str, tuple | None]]
) -> None:
    """Raise InputError for a requested axis that is not a user input's, or that the graph fixes."""
    if isinstance(setting, bool):
        return
    dims_by_name = dict(declared)
    for name, axes in setting.items():
        if name not in dims_by_name:
            raise InputError(f"dynamic: {name!r} is not a user input; expected one of {sorted(dims_by_name)}")
        dims = dims_by_name[name]
        for axis in axes:
            if dims is not None and not -len(dims) <= axis < len(dims):
                raise InputError(f"dynamic: input {name!r} has {len(dims)} axes, got axis {axis}")
            if dims is not None and isinstance(dims[axis], int):
                raise InputError(
                    f"dynamic: axis {axis} of input {name!r} is fixed to {dims[axis]} by the graph; "
                    "expected an axis the graph leaves symbolic"
                )


def candidate_groups(
    setting: bool | Mapping[str, Sequence[int]],
    declared: Sequence[tuple[str, tuple | None]],
    inputs: Sequence[torch.Tensor],
) -> tuple[Group, ...]:
    """The axes of ``inputs`` that may vary (not fixed by the graph, size 2 or more), grouped by size."""
    if setting is False:
        return ()
    by_size: dict[int, list[Axis]] = {}
    for position, ((name, dims), tensor) in enumerate(zip(declared, inputs)):
        requested = range(tensor.dim()) if setting is True else setting.get(name, ())
        for axis in sorted({axis % max(tensor.dim(), 1) for axis in requested}):
            if (dims is None or not isinstance(dims[axis], int)) and tensor.shape[axis] >= 2:
                by_size.setdefault(tensor.shape[axis], []).append((position, axis))
    return tuple(tuple(axes) for axes in by_size.values())


def probe_inputs(inputs: Sequence[torch.Tensor], group: Group) -> list[torch.Tensor]:
    """``inputs`` one longer along the axes of ``group`` (their first element repeated at the end)."""
    probed = list(inputs)
    for position, axis in group:
        tensor = probed[position]
        probed[position] = torch.cat([tensor, tensor.narrow(axis, 0, 1)], axis)
    return probed


def marked_args(args: Any, axes: Sequence[Axis]) -> Any:
    """``args`` (tensors in nested lists and tuples) with copies of the tensors named in ``axes``
    ((i, axis): the i-th tensor in order), whose axes a compilation they go to takes as dynamic
    dimensions. Copies: the caller's tensors stay unmarked, and a view would have the compilation
    guard on its base's sizes. Only a compiling call takes them: a compiled function's guards reject
    marked tensors."""
    if not axes:
        return args
    by_position: dict[int, list[int]] = {}
    for position, axis in axes:
        by_position.setdefault(position, []).append(axis)
    counter = iter(range(1 << 62))

    def mark(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            position = next(counter)
            if position not in by_position:
                return value
            copy = value.clone()
            for axis in by_position[position]:
                mark_dynamic(copy, axis)
            return copy
        if isinstance(value, (list, tuple)):
            return type(value)(mark(item) for item in value)
        return value

    return mark(args)


@dataclass(frozen=True)
class SizeProbes:
    """A converted graph's probes: ``modules[k]`` converted with ``groups[k]`` one longer than ``sizes[k]``."""

    groups: tuple[Group, ...]
    sizes: tuple[int, ...]
    modules: tuple[fx.GraphModule, ...]


def generalise(module: fx.GraphModule, probes: SizeProbes, input_names: Sequence[str]) -> tuple[Group, ...]:
    """Rewrite ``module``'s literals that follow a group's size into expressions of that size, in place;
    returns the groups that became dynamic (the others stay fixed, with a log line saying why)."""
    changes: dict[Place, dict[int, tuple[int, int]]] = {}
    fixed: dict[int, str] = {}
    for index, probe in enumerate(probes.modules):
        found = _literal_differences(module, probe)
        if isinstance(found, str):
            fixed[index] = found
            continue
        for place, values in found.items():
            changes.setdefault(place, {})[index] = values
    for place, by_group in changes.items():
        if _fit(by_group, probes.sizes) is None:
            base = next(iter(by_group.values()))[0]
            for index in by_group:
                fixed.setdefault(index, f"the literal {base} of node {_node_at(module, place[0]).name!r}")
    dynamic = [index for index in range(len(probes.groups)) if index not in fixed]
    for index, reason in fixed.items():
        log.info(
            "dynamic shapes: %s stays fixed at %d (%s depends on it); each new size compiles a step of its own",
            _axes_text(probes.groups[index], input_names),
            probes.sizes[index],
            reason,
        )
    if not dynamic:
        return ()
    _rewrite(module, probes, changes, dynamic)
    log.info(
        "dynamic shapes: %s compile once for every size >= 2",
        "; ".join(_axes_text(probes.groups[index], input_names) for index in dynamic),
    )
    return tuple(probes.groups[index] for index in dynamic)


def _axes_text(group: Group, input_names: Sequence[str]) -> str:
    return ", ".join(f"axis {axis} of {input_names[position]!r}" for position, axis in group)


def _fit(by_group: Mapping[int, tuple[int, int]], sizes: Sequence[int]) -> tuple[str, int] | None:
    """How a literal follows the sizes of the groups it changed with: ("product", c) for
    ``c * prod(sizes)``, ("offset", c) for ``size + c`` (one group), None for neither."""
    if all(base * (sizes[k] + 1) == probed * sizes[k] for k, (base, probed) in by_group.items()):
        return "product", 0
    if len(by_group) == 1:
        ((k, (base, probed)),) = by_group.items()
        if probed - base == 1:
            return "offset", base - sizes[k]
    return None


def _rewrite(
    module: fx.GraphModule, probes: SizeProbes, changes: Mapping[Place, Mapping[int, tuple[int, int]]], dynamic: list
) -> None:
    graph = module.graph
    nodes = list(graph.nodes)
    placeholders = [node for node in nodes if node.op == "placeholder"]
    sizes: dict[int, fx.Node] = {}
    with graph.inserting_after(placeholders[-1]):
        for index in reversed(dynamic):
            position, axis = probes.groups[index][0]
            sizes[index] = graph.call_method("size", (placeholders[position], axis))
    for (position, path), by_group in changes.items():
        live = [k for k in by_group if k in sizes]
        if not live:
            continue
        kind, offset = _fit(by_group, probes.sizes) or ("", 0)
        node = nodes[position]
        base = next(iter(by_group.values()))[0]
        with graph.inserting_before(node):
            if kind == "offset":
                expression = graph.call_function(operator.add, (sizes[live[0]], offset))
            else:
                expression = sizes[live[0]]
                for k in live[1:]:
                    expression = graph.call_function(operator.mul, (expression, sizes[k]))
                factor = base // math.prod(probes.sizes[k] for k in live)
                if factor != 1:
                    expression = graph.call_function(operator.mul, (expression, factor))
        node.args, node.kwargs = _replaced((node.args, node.kwargs), path, expression)
    for node in nodes:
        value = getattr(node.args[0], "meta", {}).get("val") if node.args else None
        if node.target in LINEARS and isinstance(value, torch.Tensor) and value.dim() > 2:
            node.target = linear_over_rows
    for size in sizes.values():
        if not size.users:  # a group no literal follows: its axes need no expression
            graph.erase_node(size)
    graph.lint()
    module.recompile()


def linear_over_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` of an input of 3 or more dims, as the 2-d product over its rows it runs: the same
    result, but torch.func.grad under torch.compile keeps the rows' count dynamic (the 3-d form
    specialises it)."""
    return F.linear(x.flatten(0, -2), weight, bias).unflatten(0, x.shape[:-1])


def _node_at(module: fx.GraphModule, position: int) -> fx.Node:
    return list(module.graph.nodes)[position]


def _literal_differences(base: fx.GraphModule, probe: fx.GraphModule) -> dict[Place, tuple[int, int]] | str:
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
        if a.op == "get_attr" and not _same_state(_attribute(base, a.target), _attribute(probe, b.target)):
            return f"the constant {a.target!r}"
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


def _replaced(value: Any, path: tuple, new: fx.Node) -> Any:
    if not path:
        return new
    key, rest = path[0], path[1:]
    if isinstance(value, slice):
        parts = {p: getattr(value, p) for p in ("start", "stop", "step")}
        parts[key] = _replaced(parts[key], rest, new)
        return slice(parts["start"], parts["stop"], parts["step"])
    if isinstance(value, dict):
        return {**value, key: _replaced(value[key], rest, new)}
    items = list(value)
    items[key] = _replaced(items[key], rest, new)
    return type(value)(items) if isinstance(value, (tuple, list)) else items


def _attribute(module: torch.nn.Module, target: str) -> Any:
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
