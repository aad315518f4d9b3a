"""The conversion's example run of one node: its outputs on example tensors, or, for a node whose output shapes
follow from its input shapes and whose run-time values are floating point or a quantised weight's integers,
zeros of the shapes a run on meta tensors gives (``shape_only_arguments``, ``example_run``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import torch
from torch import nn

from ort_torch_train.adapters.common import Inline
from ort_torch_train.adapters.registry import OpFacts
from ort_torch_train.convert.builder import Value
from ort_torch_train.errors import GraphSizeError, ModelError

SHAPE_ONLY_BYTES = 1 << 20  # nodes reading a run-time value this large may run on meta tensors


def output_shapes_static(facts: OpFacts, inputs: Sequence[str], values: Mapping[str, Value]) -> bool:
    """Whether a node's output shapes follow from its input shapes alone (given the constants)."""
    if facts.data_dependent_shape or facts.control_flow:
        return False
    for position, name in enumerate(inputs):
        if not name:
            continue
        value = values[name]
        if not value.static_shape or (position in facts.shape_inputs and not value.const):
            return False
    return True


def shape_only_arguments(
    node: onnx.NodeProto, facts: OpFacts, values: Mapping[str, Value], argument_names: Sequence[str], args: list
) -> list | None:
    """The arguments of ``node``'s meta run, or None where its run-time values rule one out.

    Every run-time value must be a floating-point tensor, or an integer one at a position the op declares
    quantised (``OpFacts.quantized_inputs``: a MatMulNBits or GatherBlockQuantized whose packed weight is a
    checkpoint parameter), one of them at least ``SHAPE_ONLY_BYTES`` (meta runs import torch's symbolic
    shapes, which small graphs do not pay for). Those go to the meta device with the constants; an op with
    quantised inputs reads its other integer values (GatherBlockQuantized's ids) as they are, so their range
    is checked as in the example run. Integer run-time values of any other op rule the meta run out: what
    they index is then decided by values the run does not see.
    """
    quantized = {node.input[position] for position in facts.quantized_inputs if position < len(node.input)}
    run_time = [(name, values[name].example) for name in node.input if name and not values[name].const]
    if not run_time or max(_nbytes(example) for _, example in run_time) < SHAPE_ONLY_BYTES:
        return None
    kept_concrete: set[str] = set()
    for name, example in run_time:
        if not isinstance(example, torch.Tensor):
            return None
        if example.dtype.is_floating_point or name in quantized:
            continue
        if not quantized or example.dtype == torch.bool:
            return None
        kept_concrete.add(name)
    return [
        arg.to("meta") if isinstance(arg, torch.Tensor) and name not in kept_concrete else arg
        for name, arg in zip(argument_names, args)
    ]


def example_run(
    module: nn.Module, node: onnx.NodeProto, args: list, on_meta: list | None, products: list[int] | None = None
) -> Any:
    """``node``'s outputs on ``args``. With ``on_meta`` (``shape_only_arguments``) a run on them gives the
    shapes, and floating-point outputs are zeros of those shapes: nothing folds from a run-time value, and
    what later nodes compute from it does not decide a shape. A node the meta run fails on, or that gives a
    value that is not a floating-point tensor, runs on ``args`` (the matrix products the meta run recorded
    into ``products`` dropped)."""
    if on_meta is not None:
        recorded = len(products) if products is not None else 0
        try:
            result = run_node(module, node, on_meta)
        except Exception:  # a converter that reads input values (or cannot run on meta): the example run
            result = None
        shapes = result if isinstance(result, (tuple, list)) else (result,)
        if result is not None and all(_floating_tensor(value) for value in shapes):
            zeros = [torch.zeros((), dtype=value.dtype).expand(value.shape) for value in shapes]
            return type(result)(zeros) if isinstance(result, (tuple, list)) else zeros[0]
        if products is not None:
            del products[recorded:]
    return run_node(module, node, args)


def run_node(module: nn.Module, node: onnx.NodeProto, args: list) -> Any:
    """``module`` (``node``'s conversion) called on ``args``; a failure is a ``ModelError`` naming the node."""
    call_args, call_kwargs = call_signature(module, args)
    try:
        return module(*call_args, **call_kwargs)
    except (IndexError, GraphSizeError):
        raise  # an index out of range in the example values (the user's data), or an impossible size
    except Exception as exc:
        raise ModelError(f"node {node.name!r} ({node.op_type}) failed on example inputs: {exc}") from exc


def call_signature(module: nn.Module, args: list) -> tuple[list, dict]:
    """onnx2torch's convention: absent optional inputs after the first become keyword arguments (an
    Inline call takes them positionally, as None, as its emitted fx call does)."""
    if None not in args or isinstance(module, Inline):
        return args, {}
    first_absent = args.index(None)
    names = tuple(inspect.signature(module.forward).parameters)[first_absent : len(args)]
    kwargs = {name: value for name, value in zip(names, args[first_absent:]) if value is not None}
    return args[:first_absent], kwargs


def _nbytes(example: Any) -> int:
    return example.numel() * example.element_size() if isinstance(example, torch.Tensor) else 0


def _floating_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point
