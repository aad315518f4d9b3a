"""Convert an ONNX graph into a torch.fx GraphModule specialised to one input signature.

One pass in topological order. Each node is either folded into a constant (all inputs constant, but
not a float or bool value computed from a Range: rotary tables and causal masks follow the length at
run time; or a Shape/Size of a tensor whose shape the signature fixes), dropped as a no-op for these shapes,
or converted (the project's adapters first, then onnx2torch) into one ``call_module``. Every kept
node also runs once on example tensors, so later nodes see concrete shapes and constants: that is
what turns the shape arithmetic of exported graphs into plain Python values. A node whose output shapes
follow from its input shapes and whose run-time inputs are floating point (or a quantised weight's packed
integers) runs on meta tensors instead, its outputs zeros (a graph without value-dependent shapes; ``example_run.py``). An example is dropped
once no node still to convert reads it (``Builder.reads_done``).
"""

from __future__ import annotations

import builtins
import keyword
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import torch
from torch import fx, nn

from ort_torch_train.adapters.common import Inline
from ort_torch_train.adapters.registry import OpLibrary, SubgraphConverter, op_facts
from ort_torch_train.convert.builder import Builder, Value, meta_value
from ort_torch_train.convert.control_flow import CONTROL_FLOW_OPS, convert_control_flow
from ort_torch_train.convert.example_run import (
    call_signature,
    example_run,
    output_shapes_static,
    run_node,
    shape_only_arguments,
)
from ort_torch_train.convert.matrix_products import ProductRecorder
from ort_torch_train.convert.meta_keys import INPUT_REQUIRES_GRAD, MATRIX_PRODUCTS
from ort_torch_train.convert.registry import converter_for
from ort_torch_train.dtypes import onnx_elem_type, tensor_from_proto, tensor_to_proto, torch_dtype
from ort_torch_train.errors import GraphSizeError, IndexRangeError, ModelError, UnsupportedOperatorError


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one graph input for a specialisation."""

    shape: tuple[int, ...]
    dtype: torch.dtype


log = logging.getLogger(__name__)


def convert_graph(
    graph: onnx.GraphProto,
    opsets: dict[str, int],
    input_specs: Sequence[TensorSpec],
    *,
    training: bool,
    examples: Sequence[torch.Tensor] | None = None,
    constants: Mapping[str, torch.Tensor] | None = None,
    library: OpLibrary | None = None,
    shape_only_runs: bool = True,
    on_node: Callable[[], None] | None = None,
) -> fx.GraphModule:
    """Build ``gm(*graph_inputs) -> tuple(graph_outputs)`` for inputs of ``input_specs``.

    ``examples`` (values matching the specs) only drive the example runs: nodes whose shapes
    depend on non-constant values are emitted in their run-time form either way. Without them the
    examples are zeros, which value-dependent nodes (a Reshape to a shape input) cannot run on.
    ``constants`` are initializers lifted out of ``graph`` (``lift_initializers``): the module reads
    them as they are, sharing their storage, where the graph's own initializers are copied. ``library``:
    the session's own operators (``OpLibrary``), converted before the registry's. ``shape_only_runs``
    False runs every node on its examples (a subgraph, whose values a Loop or If reads). ``on_node`` is
    called after each node is converted (a progress bar's count).
    """
    if len(input_specs) != len(graph.input):
        raise ValueError(f"graph has {len(graph.input)} inputs, {len(input_specs)} specs were given")
    builder = Builder(graph, opsets, training, _convert_node, _subgraph_converter(opsets, training, library), library)
    # a graph whose shapes can follow values (NonZero, Loop, ...) runs every node on its examples
    builder.shape_only_runs = shape_only_runs and not any(
        facts.data_dependent_shape or facts.control_flow
        for facts in (op_facts(node.domain if node.domain != "ai.onnx" else "", node.op_type) for node in graph.node)
    )
    used_placeholder_names: set[str] = set()
    given = examples is not None
    if examples is None:
        examples = [torch.zeros(spec.shape, dtype=spec.dtype) for spec in input_specs]
    written = _written_in_place(graph)
    for value_info, spec, example in zip(graph.input, input_specs, examples):
        name = _placeholder_name(value_info.name, used_placeholder_names)
        used_placeholder_names.add(name)
        builder.fx_nodes[value_info.name] = builder.fx_graph.placeholder(name)
        builder.fx_nodes[value_info.name].meta["val"] = torch.empty(spec.shape, dtype=spec.dtype, device="meta")
        if given:  # a trainable parameter's example needs a gradient (frozen_products.py reads it)
            INPUT_REQUIRES_GRAD.set(builder.fx_nodes[value_info.name], example.requires_grad)
        # the example run writes some inputs (a training BatchNorm's running statistics): those are copies
        copied = value_info.name in written
        builder.values[value_info.name] = Value(example.detach().to("cpu", copy=copied), False, True)
    graph_inputs = {value_info.name for value_info in graph.input}
    for initializer in graph.initializer:
        if initializer.name not in graph_inputs:
            builder.values[initializer.name] = Value(tensor_from_proto(initializer), True, True)
    lifted = {name: tensor for name, tensor in (constants or {}).items() if name not in graph_inputs}
    for name, tensor in lifted.items():  # an example run that writes one writes a copy
        builder.values[name] = Value(tensor.clone() if name in written else tensor, True, True)
    initializers = [*(initializer.name for initializer in graph.initializer), *lifted]
    builder.reads_done((), [*graph_inputs, *initializers])  # unread

    # Example runs must not consume the random numbers training draws (dropout masks stay reproducible).
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for index, node in enumerate(graph.node):
            builder.convert_node(node, index)
            if on_node is not None:
                on_node()

    outputs = [builder.fx_value(output.name) for output in graph.output]
    builder.fx_graph.output(tuple(outputs))
    module = fx.GraphModule(builder.root, builder.fx_graph, class_name="ConvertedGraph")
    module.graph.eliminate_dead_code()
    module.recompile()
    MATRIX_PRODUCTS.set(module, builder.matrix_products)
    log.debug(
        "converted %d ONNX nodes %s into %d fx nodes",
        len(graph.node),
        dict(Counter(node.op_type for node in graph.node)),
        len(module.graph.nodes),
    )
    for parameter in module.parameters():  # weights a converter absorbed from constants
        parameter.requires_grad_(False)
    return module


def _written_in_place(graph: onnx.GraphProto) -> set[str]:
    """Names whose tensors a node of ``graph`` (or of a subgraph) updates in place when run (OpFacts.writes_inputs)."""
    written: set[str] = set()
    for node in graph.node:
        positions = op_facts(node.domain, node.op_type).writes_inputs
        written.update(node.input[i] for i in positions if i < len(node.input) and node.input[i])
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                written |= _written_in_place(subgraph)
    return written


def _subgraph_converter(opsets: dict[str, int], training: bool, library: OpLibrary | None) -> SubgraphConverter:
    """Converts a graph attribute for its example inputs, as this conversion does."""

    def convert(graph: onnx.GraphProto, examples: Sequence[torch.Tensor]) -> fx.GraphModule:
        specs = [TensorSpec(tuple(example.shape), example.dtype) for example in examples]
        return convert_graph(
            graph, opsets, specs, training=training, examples=examples, library=library, shape_only_runs=False
        )

    return convert


def _convert_node(builder: Builder, node: onnx.NodeProto, index: int) -> None:
    missing = [name for name in node.input if name and name not in builder.values]
    if missing:
        raise ModelError(f"node {node.name!r} ({node.op_type}) reads {missing[0]!r}, which nothing produces before it")
    inputs = [builder.values.get(name) if name else None for name in node.input]
    present = [value for value in inputs if value is not None]
    domain = node.domain if node.domain != "ai.onnx" else ""

    if domain == "" and node.op_type in CONTROL_FLOW_OPS:
        builder.matrix_products = None
        convert_control_flow(builder, node, index)
        return
    if domain == "" and node.op_type in ("Shape", "Size") and present[0].static_shape:
        _fold_shape(builder, node, present[0].example)
        return
    if _is_noop(builder, node, inputs):
        builder.alias(node.output[0], node.input[0])
        return

    facts = op_facts(domain, node.op_type)
    foldable = all(value.const for value in present) and not facts.random
    module, mapping_inputs = _make_module(builder, node, inputs)
    args = [builder.values[name].example if name else None for name in mapping_inputs]
    static = output_shapes_static(facts, node.input, builder.values)
    on_meta = None
    if builder.shape_only_runs and not foldable and static and not facts.writes_inputs:
        on_meta = shape_only_arguments(node, facts, builder.values, mapping_inputs, args)
    if foldable or builder.matrix_products is None:
        result = example_run(module, node, args, on_meta)
    else:
        with ProductRecorder(builder.matrix_products) as recorder:
            result = example_run(module, node, args, on_meta, builder.matrix_products)
        if not recorder.complete:
            builder.matrix_products = None
    outputs = _split_outputs(builder, node, result)
    counted = foldable and (node.op_type == "Range" or any(value.counted for value in present))
    if counted and any(_floating_or_bool(value) for value in outputs.values()):
        # tables computed from a Range (rotary cos/sin, causal masks) run at run time from it, so that they
        # follow the length a compiled step is given (dynamic_shapes.py): only integer values fold
        foldable = False
        module, mapping_inputs = _make_module(builder, node, [_run_time_input(value) for value in inputs])
        if builder.matrix_products is not None:  # its products run at every step now
            with ProductRecorder(builder.matrix_products) as recorder:
                run_node(module, node, [builder.values[name].example if name else None for name in mapping_inputs])
            if not recorder.complete:
                builder.matrix_products = None
    if foldable:
        for name, value in outputs.items():
            builder.values[name] = Value(value, True, True, counted)
        return
    if _reshapes_to_same(node, domain, inputs, outputs):
        builder.alias(node.output[0], node.input[0])
        return

    fx_node = _emit(builder, node, index, module, [builder.fx_value(name) for name in mapping_inputs])
    multi = isinstance(result, (tuple, list))
    fx_node.meta["val"] = None if multi else meta_value(result)
    for position, name in enumerate(node.output):
        if not name or name not in outputs:
            continue
        builder.values[name] = Value(outputs[name], False, static)
        if multi:
            builder.multi_outputs[name] = (fx_node, position)
        else:
            builder.fx_nodes[name] = fx_node


def _floating_or_bool(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.dtype.is_floating_point or value.dtype == torch.bool)


def _run_time_input(value: Value | None) -> Value | None:
    """A Range-derived constant as a run-time input of the node that reads it (not absorbed by its converter)."""
    return Value(value.example, False, True) if value is not None and value.counted else value


def _emit(builder: Builder, node: onnx.NodeProto, index: int, module: nn.Module, fx_args: list) -> fx.Node:
    """One fx node running ``module``: a plain call for Inline results, else a call_module."""
    if isinstance(module, Inline):
        args = (*fx_args, *module.extra_args)
        if isinstance(module.function, str):
            return builder.fx_graph.call_method(module.function, args, module.kwargs)
        return builder.fx_graph.call_function(module.function, args, module.kwargs)
    call_args, call_kwargs = call_signature(module, fx_args)
    module_name = builder.module_name(node, index)
    builder.root.add_module(module_name, module)
    return builder.fx_graph.call_module(module_name, tuple(call_args), call_kwargs)


def _fold_shape(builder: Builder, node: onnx.NodeProto, example: torch.Tensor) -> None:
    if node.op_type == "Size":
        value = torch.tensor(example.numel(), dtype=torch.int64)
    else:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        dims = list(example.shape)
        value = torch.tensor(dims[slice(attributes.get("start", 0), attributes.get("end"))], dtype=torch.int64)
    builder.values[node.output[0]] = Value(value, True, True)


def _is_noop(builder: Builder, node: onnx.NodeProto, inputs: list[Value | None]) -> bool:
    """Identity, a Cast to the same dtype, or an inactive Dropout whose mask nobody reads."""
    if node.domain not in ("", "ai.onnx") or not inputs or inputs[0] is None:
        return False
    example = inputs[0].example
    if node.op_type == "Identity":
        return isinstance(example, torch.Tensor)
    if node.op_type == "Cast":
        to = next(a.i for a in node.attribute if a.name == "to")
        return isinstance(example, torch.Tensor) and torch_dtype(to) == example.dtype
    if node.op_type == "Dropout":
        mask_read = len(node.output) > 1 and node.output[1] in builder.consumed
        return not mask_read and (not builder.training or _constant_zero_ratio(builder, node))
    return False


def _constant_zero_ratio(builder: Builder, node: onnx.NodeProto) -> bool:
    ratio = next((a.f for a in node.attribute if a.name == "ratio"), None)
    if ratio is None and len(node.input) > 1 and node.input[1]:
        value = builder.values[node.input[1]]
        ratio = float(value.example) if value.const else None
    return ratio == 0.0


def _reshapes_to_same(node: onnx.NodeProto, domain: str, inputs: list, outputs: dict[str, Any]) -> bool:
    """A Reshape/Flatten/Squeeze/Unsqueeze/Expand whose output has its input's shape and dtype."""
    if domain != "" or node.op_type not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"):
        return False
    source, result = inputs[0].example, outputs.get(node.output[0])
    shape_inputs_const = all(value is None or value.const for value in inputs[1:])
    return (
        shape_inputs_const
        and isinstance(result, torch.Tensor)
        and result.shape == source.shape
        and result.dtype == source.dtype
    )


CONVERTER_CONSTANT_BYTES = 1 << 20  # larger constants reach converters as run-time inputs


def _make_module(builder: Builder, node: onnx.NodeProto, inputs: list[Value | None]) -> tuple[nn.Module, tuple]:
    """Convert ``node`` in a one-node graph holding its constant inputs (those up to
    ``CONVERTER_CONSTANT_BYTES``, and any that decides an output shape) and concrete input shapes."""
    domain = node.domain if node.domain != "ai.onnx" else ""
    opset = builder.opsets.get(domain, 1)
    context_graph = onnx.GraphProto(name="node")
    context_graph.node.append(_without_unread_outputs(builder, node))
    shape_inputs = op_facts(domain, node.op_type).shape_inputs
    seen: set[str] = set()
    for position, (name, value) in enumerate(zip(node.input, inputs)):
        if not name or name in seen or value is None:
            continue
        seen.add(name)
        # a weight-sized constant is read at run time (its bound tensor): not serialized for the converter
        small = position in shape_inputs or _nbytes(value.example) <= CONVERTER_CONSTANT_BYTES
        if value.const and isinstance(value.example, torch.Tensor) and small:
            context_graph.initializer.append(tensor_to_proto(value.example, name))
        elif isinstance(value.example, torch.Tensor):
            context_graph.input.append(
                onnx.helper.make_tensor_value_info(name, onnx_elem_type(value.example.dtype), list(value.example.shape))
            )
    convert = converter_for(
        domain, node.op_type, opset, builder.training, builder.opsets, builder.convert_subgraph, builder.library
    )
    try:
        module, mapping = convert(node, context_graph)
    except IndexRangeError:
        raise  # constant indices (from the inputs' shapes) out of range: not a conversion failure
    except Exception as exc:
        kind = type(exc) if isinstance(exc, (UnsupportedOperatorError, GraphSizeError)) else ModelError
        raise kind(
            f"cannot convert node {node.name!r} ({domain or 'ai.onnx'}::{node.op_type}, opset {opset}): {exc}"
        ) from exc
    return module, tuple(mapping.inputs)


def _nbytes(example: Any) -> int:
    return example.numel() * example.element_size() if isinstance(example, torch.Tensor) else 0


def _without_unread_outputs(builder: Builder, node: onnx.NodeProto) -> onnx.NodeProto:
    """A copy of ``node`` whose trailing outputs nobody reads are dropped (not computed at all).

    Split keeps them all: without a split input its output count decides the chunk sizes.
    """
    if node.op_type == "Split":
        return node
    read = [position for position, name in enumerate(node.output) if name and name in builder.consumed]
    keep = (read[-1] + 1) if read else 1
    if keep == len(node.output):
        return node
    trimmed = onnx.NodeProto()
    trimmed.CopyFrom(node)
    del trimmed.output[keep:]
    return trimmed


def _split_outputs(builder: Builder, node: onnx.NodeProto, result: Any) -> dict[str, Any]:
    names = list(node.output)
    if isinstance(result, (tuple, list)):
        return {name: value for name, value in zip(names, result) if name}
    read_later = [name for name in names[1:] if name and name in builder.consumed]
    if read_later:
        raise ModelError(
            f"the converter of node {node.name!r} ({node.op_type}) returns one output, "
            f"but its output {read_later[0]!r} is used"
        )
    return {names[0]: result}


def _placeholder_name(onnx_name: str, used: set[str]) -> str:
    """A Python name for the graph input ``onnx_name``, none of ``used``: FX renames a placeholder named like a
    builtin (``input`` -> ``input_1``), so such a name is replaced too, or the renamed one could shadow another."""
    name = re.sub(r"\W", "_", onnx_name) or "input"
    if name.isidentifier() and not keyword.iskeyword(name) and name not in vars(builtins) and name not in used:
        return name
    index = len(used)
    while f"input_{index}" in used:
        index += 1
    return f"input_{index}"
