"""Building blocks for loss (and optimizer) graphs, after ORT's ``onnxruntime.training.onnxblock``.

A ``Block`` appends ONNX nodes to the model being built (``self.base``) and returns the names of
the values it produced. Blocks compose by calling each other inside ``build``; ``generate_artifacts``
calls the loss block with the base model's output names. Example, a weighted sum of two losses::

    class WeightedMseL1(Block):
        def __init__(self):
            super().__init__()
            self.mse, self.l1 = MSELoss(), L1Loss()
            self.w_mse, self.w_l1 = Constant(0.7), Constant(0.3)
            self.mul1, self.mul2, self.add = Mul(), Mul(), Add()

        def build(self, output_name, target_name="target"):
            mse = self.mul1(self.w_mse(), self.mse(output_name, target_name))
            return self.add(mse, self.mul2(self.w_l1(), self.l1(output_name, target_name)))

New value and node names come from ``generate_graph_name`` (``onnx::<token>::<n>``). The counter
starts again at 1 for every ``generate_artifacts`` call, so the names equal those of ORT's generator
run first in a fresh process.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import onnx

from ort_torch_train.artifacts.graph_edit import find_value_info, node_arg_exists


@dataclass
class _BuildContext:
    model: onnx.ModelProto
    counter: Iterator[int]


_CONTEXT: ContextVar[_BuildContext | None] = ContextVar("ort_torch_train_block_context", default=None)


@contextlib.contextmanager
def building(model: onnx.ModelProto, counter: Iterator[int]) -> Iterator[onnx.ModelProto]:
    """Make ``model`` the one blocks edit; ``counter`` numbers new names (shared across models)."""
    token = _CONTEXT.set(_BuildContext(model, counter))
    try:
        yield model
    finally:
        _CONTEXT.reset(token)


def _context() -> _BuildContext:
    context = _CONTEXT.get()
    if context is None:
        raise RuntimeError("blocks are built by generate_artifacts (no model is being built right now)")
    return context


def generate_graph_name(token: str) -> str:
    """A new name ``onnx::<token>::<n>`` for a value or node of the model being built."""
    return f"onnx::{token}::{next(_context().counter)}"


class Block(ABC):
    """Base class of every building block: ``build`` edits ``self.base`` and returns output name(s)."""

    def __init__(self) -> None:
        self.base: onnx.ModelProto | None = None

    @abstractmethod
    def build(self, *args: Any, **kwargs: Any) -> Any:
        """Append nodes to ``self.base``; return the name (or tuple of names) of the result."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.base = _context().model
        return self.build(*args, **kwargs)

    @property
    def _model(self) -> onnx.ModelProto:
        """``self.base`` while a call builds it."""
        if self.base is None:
            raise RuntimeError(f"{type(self).__name__} builds only when called inside a model being built")
        return self.base

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str] | None = None,
        domain: str = "",
        **attributes: Any,
    ) -> list[str]:
        """Append one node; ``outputs`` are name tokens (default: ``<op>_output``). Returns output names.

        Attributes whose value is None are left out, as ``onnx.helper.make_node`` does.
        """
        tokens = outputs if outputs is not None else [f"{op_type.lower()}_output"]
        names = [generate_graph_name(token) for token in tokens]
        node = onnx.helper.make_node(
            op_type, list(inputs), names, name=generate_graph_name(op_type), domain=domain or None, **attributes
        )
        self._model.graph.node.append(node)
        return names

    def add_initializer(self, token: str, tensor: onnx.TensorProto) -> str:
        """Append ``tensor`` as an initializer under a new name; returns the name."""
        named = copy.deepcopy(tensor)
        named.name = generate_graph_name(token)
        self._model.graph.initializer.append(named)
        return named.name


class _BinaryOp(Block):
    op_type = ""

    def build(self, input_name1: str, input_name2: str) -> str:
        """The block's output name, its node added to the model being built."""
        return self.add_node(self.op_type, [input_name1, input_name2])[0]


class Add(_BinaryOp):
    """``Add(a, b)``."""

    op_type = "Add"


class Sub(_BinaryOp):
    """``Sub(a, b)``."""

    op_type = "Sub"


class Mul(_BinaryOp):
    """``Mul(a, b)``."""

    op_type = "Mul"


class Div(_BinaryOp):
    """``Div(a, b)``."""

    op_type = "Div"


class _UnaryOp(Block):
    op_type = ""

    def __init__(self, **attributes: Any) -> None:
        super().__init__()
        self._attributes = attributes

    def build(self, input_name: str) -> str:
        """The block's output name, its node added to the model being built."""
        return self.add_node(self.op_type, [input_name], **self._attributes)[0]


class Sigmoid(_UnaryOp):
    """``Sigmoid(x)``."""

    op_type = "Sigmoid"


class Log(_UnaryOp):
    """``Log(x)``."""

    op_type = "Log"


class Neg(_UnaryOp):
    """``Neg(x)``."""

    op_type = "Neg"


class Abs(_UnaryOp):
    """``Abs(x)``."""

    op_type = "Abs"


class ReduceMean(_UnaryOp):
    """``ReduceMean`` over all axes."""

    op_type = "ReduceMean"

    def __init__(self, keepdims: bool = True) -> None:
        super().__init__(keepdims=keepdims)


class ReduceSum(_UnaryOp):
    """``ReduceSum`` over all axes."""

    op_type = "ReduceSum"

    def __init__(self, keepdims: bool = True) -> None:
        super().__init__(keepdims=keepdims)


class Cast(_UnaryOp):
    """``Cast(x, to=...)`` (``to`` an ONNX element type)."""

    op_type = "Cast"

    def __init__(self, to: int) -> None:
        super().__init__(to=to)


class Pow(Block):
    """``Pow(x, exponent)`` with the exponent a float[1] initializer."""

    def __init__(self, exponent: float) -> None:
        super().__init__()
        self._exponent = exponent

    def build(self, pow_input_name: str) -> str:
        """The block's output name(s), its nodes added to the model being built."""
        exponent = onnx.helper.make_tensor("", onnx.TensorProto.FLOAT, [1], [self._exponent])
        exponent_name = self.add_initializer("pow_exponent", exponent)
        return self.add_node("Pow", [pow_input_name, exponent_name])[0]


class Constant(Block):
    """A float[1] initializer holding ``value_float``; returns its name."""

    def __init__(self, value_float: float) -> None:
        super().__init__()
        self._value = value_float

    def build(self) -> str:
        """The block's output name(s), its nodes added to the model being built."""
        return self.add_initializer(
            "initializer", onnx.helper.make_tensor("", onnx.TensorProto.FLOAT, [1], [self._value])
        )


class PassThrough(Block):
    """Returns its inputs unchanged (the 'no loss' block)."""

    def build(self, *input_names: str) -> tuple[str, ...]:
        """The block's output name(s), its nodes added to the model being built."""
        return input_names


class InputLike(Block):
    """A new graph input with the type and shape of the graph input or output ``like``."""

    def __init__(self, like: str) -> None:
        super().__init__()
        self._like = like

    def build(self, input_name: str | None = None) -> str:
        """The block's output name(s), its nodes added to the model being built."""
        graph = self._model.graph
        template = find_value_info(graph.input, self._like) or find_value_info(graph.output, self._like)
        if template is None:
            raise LookupError(f"Could not find input or output with name {self._like}")
        cloned = copy.deepcopy(template)
        cloned.name = input_name or generate_graph_name("input")
        graph.input.append(cloned)
        return cloned.name


def input_unless_exists(block: Block, name: str, like: str) -> str:
    """``name`` if some node already reads or writes it, else a new input ``name`` shaped like ``like``."""
    if node_arg_exists(block._model, name):
        return name
    return InputLike(like)(name)
