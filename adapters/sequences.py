"""ONNX sequences as far as exporters use them: SplitToSequence, SequenceAt, SequenceConstruct,
SequenceLength, ConcatFromSequence (torch's dynamo exporter writes ``tensor.split`` this way)."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from .common import (
    Inline,
    OperationConverterResult,
    attributes,
    constant_ints,
    has_input,
    input_shape,
    is_constant,
    normalize_axis,
    result,
)
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


class TensorSequence(Sequence):
    """An ONNX sequence value. Not a tuple, so the conversion loop treats it as ONE output."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        self.tensors = tuple(tensors)

    def __getitem__(self, index):
        return self.tensors[index]

    def __len__(self) -> int:
        return len(self.tensors)


def split_to_sequence(x: torch.Tensor, sizes: list[int], axis: int, squeeze: bool) -> TensorSequence:
    """``x`` split along ``axis`` into pieces of ``sizes`` (size-1 pieces squeezed when ``squeeze``)."""
    pieces = torch.split(x, sizes, axis)
    return TensorSequence(piece.squeeze(axis) for piece in pieces) if squeeze else TensorSequence(pieces)


@register("SplitToSequence", since=11)
def split_to_sequence_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    shape = input_shape(node, graph, 0)
    axis = normalize_axis(attrs.get("axis", 0), len(shape))
    if has_input(node, 1) and not is_constant(node, graph, 1):
        raise NotImplementedError("SplitToSequence: a split computed at run time is not supported")
    split = constant_ints(node, graph, 1)
    size = shape[axis]
    if split is None:
        sizes, squeeze = [1] * size, not attrs.get("keepdims", 1)
    elif len(input_shape(node, graph, 1)) == 0:  # a scalar: equal chunks, the last one smaller
        sizes, squeeze = [min(split[0], size - i * split[0]) for i in range(math.ceil(size / split[0]))], False
    else:
        sizes, squeeze = split, False
    return result(Inline(split_to_sequence, sizes, axis, squeeze), node, node.input_values[:1])


def sequence_at_dynamic(sequence: TensorSequence, position: torch.Tensor) -> torch.Tensor:
    """The sequence's element at a run-time position (negative counts from the end)."""
    return sequence[int(position)]


@register("SequenceAt", since=11)
def sequence_at(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    position = constant_ints(node, graph, 1)
    if position is None:
        return result(Inline(sequence_at_dynamic), node)
    return result(Inline(operator.getitem, position[0]), node, node.input_values[:1])


def sequence_construct(*tensors: torch.Tensor) -> TensorSequence:
    """A sequence of the given tensors."""
    return TensorSequence(tensors)


@register("SequenceConstruct", since=11)
def sequence_construct_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(sequence_construct), node)


def sequence_length(sequence: TensorSequence) -> torch.Tensor:
    """The element count as an int64 scalar tensor."""
    return torch.tensor(len(sequence), dtype=torch.int64)


@register("SequenceLength", since=11)
def sequence_length_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(sequence_length), node)


def concat_from_sequence(sequence: TensorSequence, axis: int, new_axis: bool) -> torch.Tensor:
    """The elements concatenated (or stacked, with ``new_axis``) along ``axis``."""
    return torch.stack(sequence.tensors, axis) if new_axis else torch.cat(sequence.tensors, axis)


@register("ConcatFromSequence", since=11)
def concat_from_sequence_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    attrs = attributes(node)
    return result(Inline(concat_from_sequence, attrs["axis"], bool(attrs.get("new_axis", 0))), node)
