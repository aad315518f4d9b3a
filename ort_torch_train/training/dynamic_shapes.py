"""Dynamic dimensions: one converted graph, compiled once, for every size along the axes inputs may vary.

The conversion (``convert/graph.py``) folds an exported graph's shape arithmetic into literals for
one input signature. To serve other sizes, the graph is converted once more per group of candidate
axes (axes the ONNX graph leaves symbolic, grouped by size: the batch axis of the inputs and of the
labels is one group), that group one shorter (``probe_size``: the probe's conversion, which runs the
graph on its examples, then peaks no higher than the first one). A literal that follows the group's size
is rewritten as an expression of the input's size (``c * x.size(axis)`` or ``x.size(axis) + c``), a
constant that counts up as long as the group (position ids) as ``arange`` of that expression, a grid
(an integer constant affine in its indices, or an integer or bool one of a single value: a mask's flat indices, token-type
ids), a relative table (T5's distances between query and key positions) or stacked grids (a GatherND's
index tuples) as the same table at those sizes, a table whose first rows are its shorter version as those rows
(the graph then serves sizes up to the one it was made for: ``DynamicAxes.largest``; tables computed
from a Range, rotary tables and causal masks, are not constants: the conversion leaves them to run
time), and the group's axes compile as dynamic dimensions. A group stays fixed, with an INFO line naming why, when its size reaches anything else:
another constant tensor, a submodule's settings, the graph's structure. Sizes 0 and 1 are never probed
(a compiled step made for sizes >= 2 serves size 1 too: ``torch_internals.size_one_kept_dynamic``).
torch.func.grad's linear of a 3-d input specialises its sizes: a dynamic graph runs it over its rows
instead (``linear_over_rows``). Where torch.compile specialises a
dynamic axis anyway, the step compiles again with that axis's group fixed and the other groups dynamic,
with an INFO line, and every later conversion of the graph fixes it too (``compile/step.py``,
``compile/fallbacks.py``).
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.errors import InputError
from ort_torch_train.passes.onednn_linear import LINEARS
from ort_torch_train.torch_internals import mark_dynamic
from ort_torch_train.training.graph_literals import (
    COUNT_LENGTH,
    GRID,
    PREFIX,
    Place,
    attribute,
    counting_like,
    grid_like,
    literal_differences,
    prefix_of,
    replaced,
)

log = logging.getLogger(__name__)

Axis = tuple[int, int]  # (user input position, axis)
Group = tuple[Axis, ...]  # axes that take one size together
DynamicSetting = bool | Mapping[str, Sequence[int]]


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


def follower_candidates(group: Group, others: Sequence[Group], inputs: Sequence[torch.Tensor]) -> list[Group]:
    """The axes that may have to follow ``group`` when it alone cannot change size (labels flattened to
    batch x sequence): the axes of ``others`` in other tensors whose size is a multiple of the group's,
    all together first, then each group of them alone."""
    size = group_size(inputs, group)
    tensors = {position for position, _ in group}
    multiples = [
        other
        for other in others
        if other != group and group_size(inputs, other) % size == 0 and not tensors & {p for p, _ in other}
    ]
    together = tuple(axis for other in multiples for axis in other)
    return [together, *multiples] if len(multiples) > 1 else multiples


def probe_size(size: int) -> int:
    """The size a group of axes of size ``size`` (2 or more) is probed at: one less, or 3 where it is 2
    (sizes 0 and 1 stay fixed); near ``size``, where the graph rewrites that depend on sizes decide alike."""
    return 3 if size == 2 else size - 1


def probe_inputs(inputs: Sequence[torch.Tensor], group: Group, followers: Group = ()) -> list[torch.Tensor]:
    """``inputs`` with the axes of ``group`` at their probe size (their first elements, or those repeated
    at the end), and ``followers`` by the same factor (a multiple ``m * size`` becomes ``m * probe size``)."""
    size = group_size(inputs, group)
    probed = list(inputs)
    for position, axis in group:
        probed[position] = _resized(probed[position], axis, probe_size(size))
    for position, axis in followers:
        probed[position] = _resized(probed[position], axis, probed[position].shape[axis] // size * probe_size(size))
    return probed


def _resized(tensor: torch.Tensor, axis: int, length: int) -> torch.Tensor:
    if length <= tensor.shape[axis]:
        return tensor.narrow(axis, 0, length).clone()
    return torch.cat([tensor, tensor.narrow(axis, 0, length - tensor.shape[axis])], axis)


def group_size(inputs: Sequence[torch.Tensor], group: Group) -> int:
    """The size of ``group``'s axes in ``inputs``."""
    position, axis = group[0]
    return int(inputs[position].shape[axis])


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
    """A converted graph's probes: ``modules[k]`` converted with ``groups[k]`` at the probe size of
    ``sizes[k]`` and its ``followers[k]`` by the same factor; ``shapes``: the user inputs' shapes they
    all grew from."""

    groups: tuple[Group, ...]
    modules: tuple[fx.GraphModule, ...]
    followers: tuple[Group, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each group's size in ``shapes``."""
        return tuple(self.shapes[group[0][0]][group[0][1]] for group in self.groups)


@dataclass(frozen=True)
class Follower:
    """An axis whose size is ``factor`` times the product of the sizes of dynamic ``groups`` (indices)."""

    axis: Axis
    factor: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class DynamicAxes:
    """The axes a graph compiles as dynamic dimensions: groups of axes that take one size together, and
    the axes that follow them; ``largest``: (position in ``groups``, largest size) of the groups that cut
    a constant table to their size (the others take any size)."""

    groups: tuple[Group, ...] = ()
    followers: tuple[Follower, ...] = ()
    largest: tuple[tuple[int, int], ...] = ()

    @property
    def axes(self) -> tuple[Axis, ...]:
        return (*(axis for group in self.groups for axis in group), *(f.axis for f in self.followers))

    def without(self, fixed: Collection[Axis], shapes: Sequence[Sequence[int]]) -> DynamicAxes:
        """These axes less the groups holding an axis of ``fixed`` (the graph reads one size for all of a
        group's axes) and the ``fixed`` followers; a follower of a group left out follows the others, its
        factor times that group's size in ``shapes`` (the inputs' shapes), and none if none is left."""
        kept = [index for index, group in enumerate(self.groups) if not set(group) & set(fixed)]
        place = {index: new for new, index in enumerate(kept)}
        followers = []
        for follower in self.followers:
            still = tuple(place[k] for k in follower.groups if k in place)
            if follower.axis in fixed or not still:
                continue
            left = math.prod(
                shapes[self.groups[k][0][0]][self.groups[k][0][1]] for k in follower.groups if k not in place
            )
            followers.append(Follower(follower.axis, follower.factor * left, still))
        largest = tuple((place[k], size) for k, size in self.largest if k in place)
        return DynamicAxes(tuple(self.groups[k] for k in kept), tuple(followers), largest)


def generalise(
    module: fx.GraphModule, probes: SizeProbes, input_names: Sequence[str], linear_rows: bool = True
) -> DynamicAxes:
    """Rewrite ``module``'s literals that follow a group's size into expressions of that size, in place;
    returns the groups that became dynamic and their followers (the other groups stay fixed, with a log
    line saying why). ``linear_rows``: linears of 3-d inputs run over their rows (``linear_over_rows``),
    for torch.compile."""
    changes: dict[Place, dict[int, tuple[int, int]]] = {}
    fixed: dict[int, str] = {}
    for index, probe in enumerate(probes.modules):
        found = literal_differences(module, probe)
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
        return DynamicAxes()
    _rewrite(module, probes, changes, dynamic, linear_rows)
    followers = _followers(probes, dynamic)
    # a table cut to a group's size serves the sizes up to the one it was made for
    largest = {
        place: probes.sizes[index]
        for (_, path), by_group in changes.items()
        if path[:1] == (PREFIX,)
        for place, index in enumerate(dynamic)
        if index in by_group
    }
    log.info(
        "dynamic shapes: %s compile once for every size >= 1 (eager graphs: >= 2)%s",
        "; ".join(
            _axes_text(probes.groups[index], input_names) + (f" (up to {largest[place]})" if place in largest else "")
            for place, index in enumerate(dynamic)
        ),
        "".join(f"; {_axes_text((f.axis,), input_names)} follows them" for f in followers),
    )
    return DynamicAxes(tuple(probes.groups[index] for index in dynamic), followers, tuple(largest.items()))


def _followers(probes: SizeProbes, dynamic: Sequence[int]) -> tuple[Follower, ...]:
    """The follower axes of the ``dynamic`` probes, each with the dynamic groups it follows (positions in
    ``dynamic``) and its size's factor over theirs (an axis whose size is not such a multiple: none)."""
    followed: dict[Axis, list[int]] = {}
    for place, index in enumerate(dynamic):
        for follower in probes.followers[index]:
            followed.setdefault(follower, []).append(place)
    followers = []
    for (position, axis), groups in followed.items():
        factor, rest = divmod(probes.shapes[position][axis], math.prod(probes.sizes[dynamic[k]] for k in groups))
        if not rest:
            followers.append(Follower((position, axis), factor, tuple(groups)))
    return tuple(followers)


def _axes_text(group: Group, input_names: Sequence[str]) -> str:
    return ", ".join(f"axis {axis} of {input_names[position]!r}" for position, axis in group)


def _fit(by_group: Mapping[int, tuple[int, int]], sizes: Sequence[int]) -> tuple[str, int] | None:
    """How a literal follows the sizes of the groups it changed with (at their sizes, and at each one's
    probe size): ("product", c) for ``c * prod(sizes)``, ("offset", c) for ``size + c`` (one group), None
    for neither."""
    (literal, _), *_ = by_group.values()
    if literal % math.prod(sizes[k] for k in by_group) == 0 and all(
        base * probe_size(sizes[k]) == probed * sizes[k] for k, (base, probed) in by_group.items()
    ):
        return "product", 0
    if len(by_group) == 1:
        ((k, (base, probed)),) = by_group.items()
        if probed - base == probe_size(sizes[k]) - sizes[k]:
            return "offset", base - sizes[k]
    return None


def _rewrite(
    module: fx.GraphModule,
    probes: SizeProbes,
    changes: Mapping[Place, Mapping[int, tuple[int, int]]],
    dynamic: list,
    linear_rows: bool,
) -> None:
    graph = module.graph
    nodes = list(graph.nodes)
    placeholders = [node for node in nodes if node.op == "placeholder"]
    sizes: dict[int, fx.Node] = {}
    grids: dict[int, dict[tuple[str, int], fx.Node]] = {}  # by node position: a grid's sizes and steps
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
            if path == COUNT_LENGTH:
                node.replace_all_uses_with(counting_like(graph, attribute(module, node.target), expression))
        if path == COUNT_LENGTH:
            graph.erase_node(node)
        elif path[:1] == (GRID,):
            grids.setdefault(position, {})[(path[1], path[2])] = expression
        elif path[:1] == (PREFIX,):
            users = list(node.users)
            assert node.next is not None
            with graph.inserting_before(node.next):
                cut = prefix_of(graph, node, path[1], expression)
            for user in users:
                user.replace_input_with(node, cut)
        else:
            node.args, node.kwargs = replaced((node.args, node.kwargs), path, expression)
    for position, parts in grids.items():
        node = nodes[position]
        with graph.inserting_before(node):
            node.replace_all_uses_with(grid_like(graph, attribute(module, node.target), parts))
        graph.erase_node(node)
    for node in nodes:
        first = node.args[0] if node.args else None
        value = first.meta.get("val") if isinstance(first, fx.Node) else None
        if linear_rows and node.target in LINEARS and isinstance(value, torch.Tensor) and value.dim() > 2:
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
