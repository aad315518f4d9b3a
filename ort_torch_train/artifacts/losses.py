"""The loss blocks of ORT's generator (``onnxblock.loss``), node for node, and ``LossType``."""

from __future__ import annotations

import copy
from enum import Enum

import numpy as np
import onnx

from ort_torch_train.artifacts.blocks import (
    Abs,
    Add,
    Block,
    Log,
    Mul,
    Neg,
    PassThrough,
    Pow,
    ReduceMean,
    ReduceSum,
    Sigmoid,
    Sub,
    generate_graph_name,
    input_unless_exists,
)
from ort_torch_train.artifacts.graph_edit import find_value_info, node_arg_exists
from ort_torch_train.errors import ModelError

_REDUCTIONS = {"mean": ReduceMean, "sum": ReduceSum, "none": PassThrough}


class LossType(Enum):
    """The built-in losses, for ``generate_artifacts(loss=...)``."""

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4
    LanguageModelLoss = 5  # not in onnxruntime-training: cross-entropy over [B, T, V] logits (LanguageModelLoss)


def _check_reduction(reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"Reduction {reduction!r} not supported: use 'mean', 'sum' or 'none'")
    return reduction


def _reduction(reduction: str) -> Block:
    block = _REDUCTIONS[_check_reduction(reduction)]
    return PassThrough() if block is PassThrough else block(keepdims=False)


class MSELoss(Block):
    """``reduce((output - target) ** 2)``: Sub, Pow(2), ReduceMean|ReduceSum. ``target`` is shaped like the output."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self._reduce = _reduction(reduction)
        self._sub, self._square = Sub(), Pow(2.0)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        """The block's output name(s), its nodes added to the model being built."""
        target_name = input_unless_exists(self, target_name, like=loss_input_name)
        return self._reduce(self._square(self._sub(loss_input_name, target_name)))


class L1Loss(Block):
    """``reduce(abs(output - target))``: Sub, Abs, ReduceMean|ReduceSum."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self._reduce = _reduction(reduction)
        self._abs, self._sub = Abs(), Sub()

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        """The block's output name(s), its nodes added to the model being built."""
        target_name = input_unless_exists(self, target_name, like=loss_input_name)
        return self._reduce(self._abs(self._sub(loss_input_name, target_name)))


class CrossEntropyLoss(Block):
    """One ONNX ``SoftmaxCrossEntropyLoss`` node (outputs loss and log_prob).

    ``labels`` is int64, shaped like the scores without their last (class) dimension.
    """

    def __init__(
        self, weight: np.ndarray | None = None, reduction: str = "mean", ignore_index: int | None = None
    ) -> None:
        super().__init__()
        self._weight, self._reduction, self._ignore_index = weight, _check_reduction(reduction), ignore_index

    def build(self, scores_input_name: str, labels_name: str = "labels") -> str:
        """The block's output name(s), its nodes added to the model being built."""
        weight_name = generate_graph_name("celoss.weight")
        if self._weight is not None:
            self._model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(self._weight), weight_name))
        if not node_arg_exists(self._model, labels_name):
            _require_class_scores(self._model.graph, scores_input_name)
            self._model.graph.input.append(_labels_like(self._model.graph, scores_input_name, labels_name))
        inputs = [scores_input_name, labels_name] + ([weight_name] if self._weight is not None else [])
        loss_name, _ = self.add_node(
            "SoftmaxCrossEntropyLoss",
            inputs,
            outputs=["loss", "log_prob"],
            reduction=self._reduction,
            ignore_index=self._ignore_index,
        )
        return loss_name


class LanguageModelLoss(Block):
    """Cross-entropy of ``[B, T, V]`` logits against ``[B, T]`` int64 labels over the last axis, as
    transformers' causal-LM loss: the mean over the tokens whose label is not ``ignore_index`` (-100),
    with ``shift`` the logits at ``t`` scored against the label at ``t + 1``.

    Nodes: Slice (when shifting), Transpose to ``[B, V, T]``, one ``SoftmaxCrossEntropyLoss``.
    """

    def __init__(self, ignore_index: int = -100, shift: bool = True, reduction: str = "mean") -> None:
        super().__init__()
        self._ignore_index, self._shift, self._reduction = ignore_index, shift, _check_reduction(reduction)

    def build(self, logits_name: str, labels_name: str = "labels") -> str:
        """The block's output name(s), its nodes added to the model being built."""
        if not node_arg_exists(self._model, labels_name):
            self._model.graph.input.append(_labels_like(self._model.graph, logits_name, labels_name))
        scores, labels = logits_name, labels_name
        if self._shift:
            axis = self.add_initializer("lmloss.axis", onnx.numpy_helper.from_array(np.array([1], np.int64)))
            zero = self.add_initializer("lmloss.zero", onnx.numpy_helper.from_array(np.array([0], np.int64)))
            one = self.add_initializer("lmloss.one", onnx.numpy_helper.from_array(np.array([1], np.int64)))
            last = self.add_initializer("lmloss.last", onnx.numpy_helper.from_array(np.array([-1], np.int64)))
            end = self.add_initializer("lmloss.end", onnx.numpy_helper.from_array(np.array([2**62], np.int64)))
            (scores,) = self.add_node("Slice", [scores, zero, last, axis], outputs=["lmloss_scores"])
            (labels,) = self.add_node("Slice", [labels, one, end, axis], outputs=["lmloss_labels"])
        (scores,) = self.add_node("Transpose", [scores], outputs=["lmloss_classes_first"], perm=[0, 2, 1])
        loss_name, _ = self.add_node(
            "SoftmaxCrossEntropyLoss",
            [scores, labels],
            outputs=["loss", "log_prob"],
            reduction=self._reduction,
            ignore_index=self._ignore_index,
        )
        return loss_name


def _require_class_scores(graph: onnx.GraphProto, scores_name: str) -> None:
    """Refuse scores of rank 3 or more (a language model's ``[B, T, V]`` logits), whose labels
    CrossEntropyLoss would declare without their last axis while SoftmaxCrossEntropyLoss reads classes on axis 1."""
    scores = find_value_info(graph.output, scores_name)
    if scores is None or not scores.type.tensor_type.HasField("shape"):
        return
    dims = [dim.dim_param or dim.dim_value for dim in scores.type.tensor_type.shape.dim]
    if len(dims) >= 3:
        raise ModelError(
            f"loss CrossEntropyLoss: the scores {scores_name!r} have shape {dims} (rank {len(dims)}), expected "
            "[batch, classes]; for a language model's [B, T, V] logits use LossType.LanguageModelLoss "
            "(cross-entropy over the last axis against [B, T] labels)"
        )


def _labels_like(graph: onnx.GraphProto, scores_name: str, labels_name: str) -> onnx.ValueInfoProto:
    scores = find_value_info(graph.output, scores_name)
    if scores is None:
        raise LookupError(f"The provided output name {scores_name} is not a graph output.")
    labels = copy.deepcopy(scores)
    labels.name = labels_name
    labels.type.tensor_type.elem_type = onnx.TensorProto.INT64
    if labels.type.tensor_type.HasField("shape") and labels.type.tensor_type.shape.dim:
        del labels.type.tensor_type.shape.dim[-1]  # classes are the last dimension
    return labels


class BCEWithLogitsLoss(Block):
    """``reduce(-(log(sigmoid(x)) * t [* pos_weight] + log(1 - sigmoid(x)) * (1 - t)) [* weight])``.

    ``target`` is float, shaped like the output.
    """

    def __init__(
        self, weight: np.ndarray | None = None, reduction: str = "mean", pos_weight: np.ndarray | None = None
    ) -> None:
        super().__init__()
        self._weight, self._pos_weight = weight, pos_weight
        self._reduce = _reduction(reduction)
        self._sigmoid, self._log, self._sub, self._add, self._mul, self._neg = (
            Sigmoid(),
            Log(),
            Sub(),
            Add(),
            Mul(),
            Neg(),
        )

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        """The block's output name(s), its nodes added to the model being built."""
        graph = self._model.graph
        pos_weight_name = generate_graph_name("bceloss.pos_weight")
        if self._pos_weight is not None:
            graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(self._pos_weight), pos_weight_name))
        weight_name = generate_graph_name("bceloss.weight")
        if self._weight is not None:
            graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(self._weight), weight_name))
        ones = []
        for _ in range(2):
            ones.append(generate_graph_name("bceloss.sub_ones"))
            graph.initializer.append(onnx.helper.make_tensor(ones[-1], onnx.TensorProto.FLOAT, [1], [1.0]))
        if not node_arg_exists(self._model, target_name):
            target = find_value_info(graph.output, loss_input_name)
            if target is None:
                raise LookupError(f"The provided output name {loss_input_name} is not a graph output.")
            target = copy.deepcopy(target)
            target.name = target_name
            graph.input.append(target)

        sigmoid = self._sigmoid(loss_input_name)
        positive = self._mul(self._log(sigmoid), target_name)
        if self._pos_weight is not None:
            positive = self._mul(positive, pos_weight_name)
        negative = self._mul(self._log(self._sub(ones[0], sigmoid)), self._sub(ones[1], target_name))
        loss = self._neg(self._add(positive, negative))
        if self._weight is not None:
            loss = self._mul(weight_name, loss)
        return self._reduce(loss)


LOSS_BLOCKS = {
    LossType.MSELoss: MSELoss,
    LossType.CrossEntropyLoss: CrossEntropyLoss,
    LossType.BCEWithLogitsLoss: BCEWithLogitsLoss,
    LossType.L1Loss: L1Loss,
    LossType.LanguageModelLoss: LanguageModelLoss,
}
