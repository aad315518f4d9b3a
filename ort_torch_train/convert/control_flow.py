"""If, Loop and Scan: their subgraphs converted by the same pass, then inlined, unrolled or run at run time.

- ``If`` on a constant condition: the chosen branch's nodes are converted in place.
  On a run-time condition: both branches under ``torch.cond`` (their outputs must agree in shape and dtype).
- ``Loop`` with a constant trip count and no run-time termination: the body is called once per
  iteration in the graph (unrolled). Otherwise a module runs the body while the trip count and
  condition, read at run time, allow.
- ``Scan``: unrolled over the (static) scanned axis.

A loop is unrolled only while its trips times its body's work (the calls it makes, nested unrolled
loops counted in full) stay within ``MAX_UNROLLED_WORK``; beyond, a module runs it at run time, so a
long or deeply nested loop makes a graph of bounded size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import getitem
from typing import Any

import onnx
import torch
from torch import fx, nn

from ort_torch_train.adapters.registry import declare
from ort_torch_train.convert.builder import Builder, Value, meta_value
from ort_torch_train.convert.meta_keys import GRAPH_WORK
from ort_torch_train.convert.run_time_loops import RunTimeLoop, RunTimeScan, signature
from ort_torch_train.convert.subgraphs import names_read, outer_names
from ort_torch_train.dtypes import onnx_elem_type, tensor_from_proto, tensor_to_proto
from ort_torch_train.errors import UnsupportedOperatorError

CONTROL_FLOW_OPS = ("If", "Loop", "Scan")
MAX_UNROLL = 256  # longer static loops run as a run-time loop (graph size)
MAX_COMPILED_IF_DEPTH = 10  # torch.cond nesting that Dynamo traces (eager runs choose branches in Python)
MAX_UNROLLED_WORK = 16384  # calls an unrolled loop may add to a graph, nested unrolled loops included

for _op_type in CONTROL_FLOW_OPS:
    declare(_op_type, control_flow=True)


def graph_work(module: nn.Module) -> int:
    """The calls one run of ``module`` makes: a converted graph's call nodes, each submodule call counted
    as that submodule's work (so a body unrolled n times counts n times); a run-time loop counts its body once."""
    if isinstance(module, fx.GraphModule):
        known = GRAPH_WORK.get(module, None)
        if known is None:
            calls = (n for n in module.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
            known = sum(graph_work(_submodule(module, str(n.target))) if n.op == "call_module" else 1 for n in calls)
            GRAPH_WORK.set(module, known)
        return known
    children = list(module.children())
    return sum(graph_work(child) for child in children) if children else 1


def convert_control_flow(builder: Builder, node: onnx.NodeProto, index: int) -> None:
    """Convert an If, Loop or Scan node into ``builder``'s graph."""
    {"If": _convert_if, "Loop": _convert_loop, "Scan": _convert_scan}[node.op_type](builder, node, index)


# Subgraphs -------------------------------------------------------------------------------
class _Subgraph:
    """A subgraph converted for given formal-input examples; non-constant outer values become extra inputs."""

    def __init__(self, builder: Builder, graph: onnx.GraphProto, formal: Sequence[torch.Tensor], outer: Sequence[str]):
        proto = onnx.GraphProto(name=graph.name or "subgraph")
        proto.node.extend(graph.node)
        proto.initializer.extend(graph.initializer)
        proto.output.extend(graph.output)
        self.operands = [name for name in outer if not builder.values[name].const]
        examples = list(formal)
        for value_info, example in zip(graph.input, formal):
            proto.input.append(_value_info(value_info.name, example))
        for name in outer:
            value = builder.values[name]
            if value.const:
                proto.initializer.append(tensor_to_proto(value.example, name))
            else:
                proto.input.append(_value_info(name, value.example))
                examples.append(value.example)
        self.module = builder.convert_subgraph(proto, examples)
        self.signature = signature(formal)


def _value_info(name: str, example: torch.Tensor) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, onnx_elem_type(example.dtype), list(example.shape))


def _attribute_graph(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == name)


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def _unsupported(node: onnx.NodeProto, reason: str) -> UnsupportedOperatorError:
    return UnsupportedOperatorError(f"{node.op_type} node {node.name!r}: {reason}")


class _Emitter:
    """Emits calls of converted subgraphs into the outer graph and runs them on the example values."""

    def __init__(self, builder: Builder, node: onnx.NodeProto, index: int):
        self.builder, self.node, self.index = builder, node, index
        self.targets: dict[int, str] = {}

    def call(self, module: nn.Module, fx_args: Sequence, example_args: Sequence) -> tuple[list[fx.Node], list]:
        """Call ``module`` (once registered per node) and split its tuple of outputs."""
        if id(module) not in self.targets:
            self.targets[id(module)] = self.builder.module_name(self.node, self.index)
            self.builder.root.add_module(self.targets[id(module)], module)
        call = self.builder.fx_graph.call_module(self.targets[id(module)], tuple(fx_args))
        outputs = module(*example_args)
        return [self.function(getitem, (call, i), value) for i, value in enumerate(outputs)], list(outputs)

    def function(self, function: Callable[..., Any], args: tuple, example: Any) -> fx.Node:
        node = self.builder.fx_graph.call_function(function, args)
        node.meta["val"] = meta_value(example)
        return node

    def constant(self, value: torch.Tensor) -> fx.Node:
        node = self.builder.constant(value)
        node.meta["val"] = meta_value(value)
        return node

    def define(self, names: Sequence[str], fx_nodes: Sequence[fx.Node], examples: Sequence) -> None:
        for name, fx_node, example in zip(names, fx_nodes, examples):
            if name:
                self.builder.values[name] = Value(example, False, False)
                self.builder.fx_nodes[name] = fx_node


# If ---------------------------------------------------------------------------------------
def _convert_if(builder: Builder, node: onnx.NodeProto, index: int) -> None:
    condition = builder.values[node.input[0]]
    branches = [_attribute_graph(node, "then_branch"), _attribute_graph(node, "else_branch")]
    if condition.const:
        branch = branches[0] if bool(condition.example.reshape(-1)[0]) else branches[1]
        builder.consumed |= names_read(branch)
        builder.expect_reads(branch)
        for initializer in branch.initializer:
            builder.values[initializer.name] = Value(tensor_from_proto(initializer), True, True)
        for inner in branch.node:
            builder.convert_node(inner, index)
        for name, output in zip(node.output, branch.output):
            if name:
                builder.alias(name, output.name)
        builder.reads_done((output.name for output in branch.output), (i.name for i in branch.initializer))
        return
    outer = list(dict.fromkeys(name for branch in branches for name in outer_names(branch)))
    converted = [_Subgraph(builder, branch, [], outer) for branch in branches]
    operands = converted[0].operands
    examples = [builder.values[name].example for name in operands]
    results = [branch.module(*examples) for branch in converted]
    if signature(results[0]) != signature(results[1]):
        shapes = f"then: {signature(results[0])}, else: {signature(results[1])}"
        raise _unsupported(
            node,
            "with a run-time condition its branches must give outputs of the same shapes "
            f"and dtypes for torch.cond ({shapes})",
        )
    emitter = _Emitter(builder, node, index)
    module = _Cond(converted[0].module, converted[1].module, node.name)
    fx_args = [builder.fx_value(node.input[0]), *(builder.fx_value(name) for name in operands)]
    fx_nodes, outputs = emitter.call(module, fx_args, [condition.example, *examples])
    emitter.define(node.output, fx_nodes, outputs)


class _Cond(nn.Module):
    """Two converted branches: chosen in Python in eager runs (nested Ifs at any depth), under ``torch.cond``
    in compiled ones. torch.cond forbids aliasing: the outputs are copied, and so are the operands
    (parameters are views of one flat buffer, ``state/flat.py``)."""

    def __init__(self, then_branch: nn.Module, else_branch: nn.Module, name: str):
        super().__init__()
        self.then_branch, self.else_branch, self.name = then_branch, else_branch, name
        inner = [m.depth for branch in (then_branch, else_branch) for m in branch.modules() if isinstance(m, _Cond)]
        self.depth: int = 1 + max(inner, default=0)

    def forward(self, condition: torch.Tensor, *operands: torch.Tensor) -> tuple:
        if not torch.compiler.is_compiling():  # eager: branch on the host, as ORT reads the condition there
            return tuple(self.then_branch(*operands) if bool(condition.reshape(())) else self.else_branch(*operands))
        if self.depth > MAX_COMPILED_IF_DEPTH:  # Dynamo recurses per level: past this, a bare RecursionError
            raise UnsupportedOperatorError(
                f"If node {self.name!r}: Ifs on run-time conditions nested {self.depth} deep; torch.compile "
                f"traces at most {MAX_COMPILED_IF_DEPTH} levels: run this model without compile"
            )
        operands = tuple(operand.clone() for operand in operands)
        return torch.cond(condition.reshape(()), self._then, self._else, operands)

    def _then(self, *operands):
        return tuple(output.clone() for output in self.then_branch(*operands))

    def _else(self, *operands):
        return tuple(output.clone() for output in self.else_branch(*operands))


# Loop -------------------------------------------------------------------------------------
def _convert_loop(builder: Builder, node: onnx.NodeProto, index: int) -> None:
    body = _attribute_graph(node, "body")
    trip, condition = (builder.values[name] if name else None for name in (list(node.input) + ["", ""])[:2])
    carried_names = list(node.input[2:])
    carried = [builder.values[name].example for name in carried_names]
    outer = outer_names(body)
    first_condition = torch.tensor(True) if condition is None else condition.example.reshape(()).to(torch.bool)
    subgraph = _Subgraph(builder, body, [torch.tensor(0), first_condition, *carried], outer)
    scan_count = len(body.output) - 1 - len(carried)
    emitter = _Emitter(builder, node, index)
    operand_fx = [builder.fx_value(name) for name in subgraph.operands]
    operand_examples = [builder.values[name].example for name in subgraph.operands]
    static = (
        trip is not None
        and trip.const
        and (condition is None or condition.const)
        and _condition_passes_through(subgraph.module)
        and int(trip.example) <= MAX_UNROLL
        and int(trip.example) * graph_work(subgraph.module) <= MAX_UNROLLED_WORK
    )
    trips = int(trip.example) if static and trip is not None else 0
    if static and scan_count and (trips == 0 or not bool(first_condition)):
        raise _unsupported(node, "a loop of no iteration with scan outputs (their shapes are unknown)")
    if not static:
        module = RunTimeLoop(subgraph.module, len(carried), scan_count)
        fx_args = [builder.fx_value(name) for name in node.input[:2]] + [builder.fx_value(n) for n in carried_names]
        examples = [None if v is None else v.example for v in (trip, condition)] + carried + operand_examples
        fx_nodes, outputs = emitter.call(module, fx_args + operand_fx, examples)
        emitter.define(node.output, fx_nodes, outputs)
        return
    condition_fx = emitter.constant(first_condition) if condition is None else builder.fx_input(node.input[1])
    carried_fx = [builder.fx_input(name) for name in carried_names]
    scans: list[tuple[list, list]] = []
    for iteration in range(trips if bool(first_condition) else 0):
        step = torch.tensor(iteration, dtype=torch.int64)
        args = [emitter.constant(step), condition_fx, *carried_fx, *operand_fx]
        fx_nodes, outputs = emitter.call(subgraph.module, args, [step, first_condition, *carried, *operand_examples])
        if signature(outputs[1 : 1 + len(carried)]) != signature(carried):
            raise _unsupported(node, "loop-carried values change shape or dtype between iterations")
        carried_fx, carried = fx_nodes[1 : 1 + len(carried)], outputs[1 : 1 + len(carried)]
        scans.append((fx_nodes[1 + len(carried) :], outputs[1 + len(carried) :]))
    stacked_fx, stacked = [], []
    for k in range(scan_count):
        values = [outputs[k] for _, outputs in scans]
        stacked.append(torch.stack(values))
        stacked_fx.append(emitter.function(torch.stack, ([fx_nodes[k] for fx_nodes, _ in scans],), stacked[-1]))
    emitter.define(node.output, carried_fx + stacked_fx, carried + stacked)


def _condition_passes_through(body: fx.GraphModule) -> bool:
    """Whether the body's condition output is its condition input (no run-time termination)."""
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    output = next(n for n in body.graph.nodes if n.op == "output").args[0][0]
    return output is placeholders[1] or (
        output.op == "get_attr" and bool(_attr(body, str(output.target)).reshape(-1)[0])
    )


def _submodule(module: nn.Module, target: str) -> nn.Module:
    return module.get_submodule(target)


def _attr(module: nn.Module, target: str) -> torch.Tensor:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


# Scan -------------------------------------------------------------------------------------
def _convert_scan(builder: Builder, node: onnx.NodeProto, index: int) -> None:
    body = _attribute_graph(node, "body")
    scan_inputs = next(a.i for a in node.attribute if a.name == "num_scan_inputs")
    opset = builder.opsets.get("", 1)
    names = list(node.input)
    if opset < 9:
        lengths, names = names[0], names[1:]
        if lengths:
            raise _unsupported(node, "opset-8 sequence_lens is not supported (scan every step: leave it out)")
    states, scanned = names[: len(names) - scan_inputs], names[len(names) - scan_inputs :]
    emitter = _Emitter(builder, node, index)
    if opset >= 9:
        fx_nodes, outputs = _unroll_scan(builder, emitter, node, body, states, scanned)
    else:  # opset 8: a batch axis first, each batch element scanned on its own
        batch = builder.values[names[0]].example.shape[0]
        per_batch = [_unroll_scan(builder, emitter, node, body, states, scanned, b) for b in range(batch)]
        fx_nodes, outputs = [], []
        for k in range(len(per_batch[0][0])):
            outputs.append(torch.stack([o[k] for _, o in per_batch]))
            fx_nodes.append(emitter.function(torch.stack, ([f[k] for f, _ in per_batch],), outputs[-1]))
    emitter.define(node.output, fx_nodes, outputs)


def _unroll_scan(
    builder: Builder,
    emitter: _Emitter,
    node: onnx.NodeProto,
    body: onnx.GraphProto,
    states: list[str],
    scanned: list[str],
    batch: int | None = None,
) -> tuple[list[fx.Node], list[torch.Tensor]]:
    """The body called per step on slices of the scanned inputs; returns final states and stacked scan outputs."""

    def select(name: str, axis: int, position: int) -> tuple[fx.Node, torch.Tensor]:
        example = builder.values[name].example.select(axis, position)
        return emitter.function(torch.select, (builder.fx_value(name), axis, position), example), example

    state_values = [
        select(n, 0, batch) if batch is not None else (builder.fx_input(n), builder.values[n].example) for n in states
    ]
    sources = [
        select(n, 0, batch) if batch is not None else (builder.fx_input(n), builder.values[n].example) for n in scanned
    ]
    ranks = [example.dim() for _, example in sources]
    axes = [a % r for a, r in zip(_ints(node, "scan_input_axes") or [0] * len(sources), ranks)]
    directions = _ints(node, "scan_input_directions") or _ints(node, "directions") or [0] * len(sources)
    length = sources[0][1].shape[axes[0]] if sources else 0
    if not length:
        raise _unsupported(node, "a scan of length 0")
    first_slices = [
        example.select(axis, length - 1 if direction else 0)
        for (_, example), axis, direction in zip(sources, axes, directions)
    ]
    subgraph = _Subgraph(builder, body, [e for _, e in state_values] + first_slices, outer_names(body))
    if length * graph_work(subgraph.module) > MAX_UNROLLED_WORK:
        operands = [(builder.fx_input(n), builder.values[n].example) for n in subgraph.operands]
        arguments = [*state_values, *sources, *operands]
        out_axes = _ints(node, "scan_output_axes") or [0] * (len(body.output) - len(states))
        out_directions = _ints(node, "scan_output_directions") or [0] * len(out_axes)
        module = RunTimeScan(subgraph.module, len(states), axes, directions, out_axes, out_directions)
        return emitter.call(module, [f for f, _ in arguments], [e for _, e in arguments])
    steps = []
    for step in range(length):
        slices = []
        for (fx_source, example), axis, direction in zip(sources, axes, directions):
            position = length - 1 - step if direction else step
            sliced = example.select(axis, position)
            slices.append((emitter.function(torch.select, (fx_source, axis, position), sliced), sliced))
        formal = [e for _, e in state_values] + [e for _, e in slices]
        if subgraph.signature != signature(formal):
            subgraph = _Subgraph(builder, body, formal, outer_names(body))
        operands = [(builder.fx_input(n), builder.values[n].example) for n in subgraph.operands]
        arguments = [*state_values, *slices, *operands]
        fx_nodes, outputs = emitter.call(subgraph.module, [f for f, _ in arguments], [e for _, e in arguments])
        state_values = list(zip(fx_nodes[: len(states)], outputs[: len(states)]))
        steps.append(list(zip(fx_nodes[len(states) :], outputs[len(states) :])))
    out_axes = _ints(node, "scan_output_axes") or [0] * len(steps[0])
    out_directions = _ints(node, "scan_output_directions") or [0] * len(steps[0])
    fx_nodes, outputs = [f for f, _ in state_values], [e for _, e in state_values]
    for k, (axis, direction) in enumerate(zip(out_axes, out_directions)):
        column = [step[k] for step in (reversed(steps) if direction else steps)]
        axis %= column[0][1].dim() + 1
        outputs.append(torch.stack([e for _, e in column], axis))
        fx_nodes.append(emitter.function(torch.stack, ([f for f, _ in column], axis), outputs[-1]))
    return fx_nodes, outputs
