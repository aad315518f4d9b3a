"""RNN, GRU and LSTM (opset 7 to 22), trainable.

torch's fused recurrent kernels run the nodes whose semantics they share (default activations, no
clip, peepholes, input_forget or sequence_lens, GRU with ``linear_before_reset=1``), with the ONNX
weights' gate blocks re-ordered on the fly (GRU ``zrh`` -> torch ``rzn``, LSTM ``iofc`` -> ``ifco``);
every other node runs the per-timestep loop of ``rnn_cells``. A compiled graph runs the fused kernel as
one opaque call with a backward of its own (``rnn_fused``), so that the length stays dynamic. A package's
step (traced by make_fx) runs the per-timestep loop: the opaque call is an op defined in Python, which the
runtime with no Python cannot run, and torch's LSTM kernel cannot be traced at symbolic sizes; the loop fixes the
length (the package builder then fixes the axes it cannot keep dynamic). onnxruntime-training's forward nodes
``com.microsoft::GRUTraining``/``LSTMTraining`` (in ORT-made training models) convert the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ort_torch_train.errors import UnsupportedOperatorError

from .common import OperationConverterResult, attributes, has_input, input_shape, result, tracing_package
from .registry import MICROSOFT, ConversionContext, register
from .rnn_cells import ActivationSpec, activation_specs, recurrent_direction
from .rnn_fused import TORCH_GATE_ORDER, fused_kernel, fused_recurrent

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

_DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_DIRECTIONS = ("forward", "reverse", "bidirectional")
_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


@dataclass(frozen=True)
class RecurrentConfig:
    """What a converted RNN/GRU/LSTM node computes, read from its attributes and present inputs."""

    op_type: str
    direction: str
    layout: int
    activations: tuple[ActivationSpec, ...]  # per direction, forward first
    clip: float | None
    linear_before_reset: bool
    input_forget: bool
    outputs: int  # Y, Y_h[, Y_c] wanted
    extra_outputs: int  # outputs only an ORT gradient node reads (GRUTraining/LSTMTraining): None
    fused: bool

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1


class Recurrent(nn.Module):
    """An ONNX RNN/GRU/LSTM node: returns ``Y, Y_h[, Y_c]`` (as many as the node has outputs)."""

    def __init__(self, config: RecurrentConfig) -> None:
        super().__init__()
        self.config = config

    def forward(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        r: torch.Tensor,
        b: torch.Tensor | None = None,
        sequence_lens: torch.Tensor | None = None,
        initial_h: torch.Tensor | None = None,
        initial_c: torch.Tensor | None = None,
        p: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor | None, ...]:
        return recurrent(x, w, r, b, sequence_lens, initial_h, initial_c, p, config=self.config)


def recurrent(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    sequence_lens: torch.Tensor | None,
    initial_h: torch.Tensor | None,
    initial_c: torch.Tensor | None,
    p: torch.Tensor | None,
    *,
    config: RecurrentConfig,
) -> torch.Tensor | tuple[torch.Tensor | None, ...]:
    """ONNX RNN/GRU/LSTM on ONNX-layout tensors."""
    if config.layout == 1:  # batch-major: compute in sequence-major
        x = x.transpose(0, 1)
        initial_h = None if initial_h is None else initial_h.transpose(0, 1)
        initial_c = None if initial_c is None else initial_c.transpose(0, 1)
    states = (config.num_directions, x.shape[1], r.shape[-1])
    h0 = x.new_zeros(states) if initial_h is None else initial_h
    c0 = None if config.op_type != "LSTM" else (x.new_zeros(states) if initial_c is None else initial_c)
    if config.fused and not tracing_package():  # in a compiled graph, one opaque call that keeps the length dynamic
        run = fused_recurrent if torch.compiler.is_compiling() else fused_kernel
        y, y_h, y_c = run(config.op_type, config.direction, config.activations[0].name == "relu", x, w, r, b, h0, c0)
    else:
        y, y_h, y_c = _looped(config, x, w, r, b, sequence_lens, h0, c0, p)
    if config.layout == 1:
        y = y.permute(2, 0, 1, 3)
        y_h = y_h.transpose(0, 1)
        y_c = None if y_c is None else y_c.transpose(0, 1)
    if config.outputs == 1 and not config.extra_outputs:
        return y
    return (y, y_h, y_c)[: config.outputs] + (None,) * config.extra_outputs


def _looped(config: RecurrentConfig, x, w, r, b, sequence_lens, h0, c0, p):
    """The per-timestep loop, one direction after the other."""
    per_direction = len(_DEFAULT_ACTIVATIONS[config.op_type])
    lengths = None if sequence_lens is None else sequence_lens.to(device=x.device, dtype=torch.int64)
    ys, hs, cs = [], [], []  # cs: the cell states of an LSTM
    for d in range(config.num_directions):
        y, h, c = recurrent_direction(
            config.op_type,
            x,
            w[d],
            r[d],
            None if b is None else b[d],
            h0[d],
            None if c0 is None else c0[d],
            None if p is None else p[d],
            lengths,
            reverse=config.direction == "reverse" or d == 1,
            activations=config.activations[d * per_direction : (d + 1) * per_direction],
            clip=config.clip,
            linear_before_reset=config.linear_before_reset,
            input_forget=config.input_forget,
        )
        ys.append(y)
        hs.append(h)
        if c is not None:
            cs.append(c)
    return torch.stack(ys, 1), torch.stack(hs), None if c0 is None else torch.stack(cs)


def _floats(value) -> list[float]:
    return [float(v) for v in value] if isinstance(value, list) else []


def recurrent_config(node: OnnxNode, op_type: str) -> RecurrentConfig:
    """The node's attributes and present inputs, checked."""
    attrs = attributes(node)
    direction = attrs.get("direction", "forward")
    if direction not in _DIRECTIONS:
        raise UnsupportedOperatorError(f"{op_type}: attribute direction={direction!r}, expected one of {_DIRECTIONS}")
    directions = 2 if direction == "bidirectional" else 1
    defaults = _DEFAULT_ACTIVATIONS[op_type]
    given = attrs.get("activations")
    names = given if isinstance(given, list) else list(defaults) * directions
    if len(names) == len(defaults) and directions == 2:
        names = names * 2
    if len(names) < len(defaults) * directions:
        raise UnsupportedOperatorError(
            f"{op_type}: attribute activations={names} has {len(names)} functions, "
            f"expected {len(defaults)} per direction ({direction})"
        )
    names = names[: len(defaults) * directions]
    activations = tuple(
        activation_specs(op_type, names, _floats(attrs.get("activation_alpha")), _floats(attrs.get("activation_beta")))
    )
    clip = attrs.get("clip")
    clip = float(clip) if isinstance(clip, (int, float)) else None
    linear_before_reset = bool(attrs.get("linear_before_reset", 0))
    input_forget = bool(attrs.get("input_forget", 0))
    default_kinds = [name.lower() for name in defaults] * directions
    kinds = [spec.name for spec in activations]
    fused = (
        (kinds == default_kinds or (op_type == "RNN" and kinds == ["relu"] * directions))
        and clip is None
        and not input_forget
        and not has_input(node, 4)  # sequence_lens
        and not has_input(node, 7)  # peepholes
        and (op_type != "GRU" or linear_before_reset)
    )
    standard = min(len(node.output_values), 3 if op_type == "LSTM" else 2)
    return RecurrentConfig(
        op_type,
        direction,
        int(attrs.get("layout", 0)),
        activations,
        clip,
        linear_before_reset,
        input_forget,
        standard,
        len(node.output_values) - standard,
        fused,
    )


def check_shapes(node: OnnxNode, graph: OnnxGraph, config: RecurrentConfig) -> None:
    """Raise ValueError naming the first input whose shape does not fit X, R and the attributes."""
    op_type = config.op_type
    shapes = {name: input_shape(node, graph, i) for i, name in enumerate(_INPUTS) if has_input(node, i)}
    for name in ("X", "R"):
        if len(shapes[name]) != 3:
            raise ValueError(f"{op_type}: input {name} must have rank 3, got shape {list(shapes[name])}")
    x, hidden = shapes["X"], shapes["R"][-1]
    batch, features = (x[0] if config.layout else x[1]), x[2]
    directions, gates = config.num_directions, len(TORCH_GATE_ORDER[op_type])
    state = (batch, directions, hidden) if config.layout else (directions, batch, hidden)
    expected = {
        "W": (directions, gates * hidden, features),
        "R": (directions, gates * hidden, hidden),
        "B": (directions, 2 * gates * hidden),
        "sequence_lens": (batch,),
        "initial_h": state,
        "initial_c": state,
        "P": (directions, 3 * hidden),
    }
    size = attributes(node).get("hidden_size", hidden)
    if size != hidden:
        raise ValueError(f"{op_type}: attribute hidden_size={size} but input R has hidden size {hidden}")
    for name, shape in expected.items():
        if name in shapes and tuple(shapes[name]) != shape:
            raise ValueError(
                f"{op_type}: input {name} must have shape {list(shape)} (direction={config.direction}, "
                f"layout={config.layout}, X {list(x)}, hidden {hidden}), got {list(shapes[name])}"
            )


def _convert(node: OnnxNode, graph: OnnxGraph, op_type: str):
    config = recurrent_config(node, op_type)
    check_shapes(node, graph, config)
    return result(Recurrent(config), node)


@register("RNN", since=7)
@register("GRU", since=7)
@register("LSTM", since=7)
def recurrent_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return _convert(node, graph, node.operation_type)


@register("GRUTraining", domain=MICROSOFT)
@register("LSTMTraining", domain=MICROSOFT)
def recurrent_training_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    """ORT's forward GRU/LSTM: the ONNX op, plus gate/cell intermediates for its gradient node (autograd here)."""
    return _convert(node, graph, node.operation_type.removesuffix("Training"))
