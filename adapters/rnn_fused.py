"""torch's fused RNN/GRU/LSTM kernels as one opaque step of a compiled graph, whatever the length.

Traced by torch.compile, ``aten::lstm`` (and GRU, RNN) decomposes into a loop over the time steps, which
fixes the length: every new length compiles a graph of its own. ``fused_recurrent`` keeps the kernel
whole instead: a custom op (its output shapes follow the input's, the length included) applied by an
autograd Function whose backward is a second custom op, which runs the kernel again under autograd and
returns its input gradients. torch.compile takes the Function's application as one call
(``written_whole``): its backward is then the Function's own, inside ``torch.func.grad`` too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import _VF, Tensor

from ort_torch_train.torch_internals import autograd_dispatch, written_whole

TORCH_GATE_ORDER = {"RNN": (0,), "GRU": (1, 0, 2), "LSTM": (0, 2, 3, 1)}


def fused_kernel(
    op_type: str,
    direction: str,
    relu: bool,
    x: Tensor,
    w: Tensor,
    r: Tensor,
    b: Tensor | None,
    h0: Tensor,
    c0: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """torch's fused kernel of an ONNX RNN/GRU/LSTM node in layout 0; Y as ``[seq, directions, batch, hidden]``."""
    order = TORCH_GATE_ORDER[op_type]
    directions = 2 if direction == "bidirectional" else 1
    weights = []
    for d in range(directions):
        weights += [_reorder(w[d], order), _reorder(r[d], order)]
        if b is not None:
            weights += [_reorder(bias, order) for bias in b[d].chunk(2)]
    reverse = direction == "reverse"
    if reverse:
        x = x.flip(0)
    args = (weights, b is not None, 1, 0.0, torch.is_grad_enabled(), directions == 2, False)
    y_c = None
    if op_type == "LSTM":
        assert c0 is not None
        y, y_h, y_c = _VF.lstm(x, (h0, c0), *args)
    elif op_type == "GRU":
        y, y_h = _VF.gru(x, h0, *args)
    else:
        y, y_h = (_VF.rnn_relu if relu else _VF.rnn_tanh)(x, h0, *args)
    if reverse:
        y = y.flip(0)
    return y.view(x.shape[0], x.shape[1], directions, -1).transpose(1, 2), y_h, y_c


def _reorder(tensor: Tensor, order: tuple[int, ...]) -> Tensor:
    if len(order) == 1:
        return tensor
    blocks = tensor.chunk(len(order))
    return torch.cat([blocks[i] for i in order])


@torch.library.custom_op("ort_torch_train::fused_recurrent", mutates_args=())
def _forward_op(
    x: Tensor,
    w: Tensor,
    r: Tensor,
    b: Tensor | None,
    h0: Tensor,
    c0: Tensor | None,
    op_type: str,
    direction: str,
    relu: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``fused_kernel``'s Y, Y_h and Y_c (an empty tensor for RNN and GRU), without autograd; contiguous,
    as the fake kernel says (a compiled graph checks the strides)."""
    with torch.no_grad():
        y, y_h, y_c = fused_kernel(op_type, direction, relu, x, w, r, b, h0, c0)
    return y.contiguous(), y_h.contiguous(), y_h.new_empty(0) if y_c is None else y_c.contiguous()


@_forward_op.register_fake
def _(x, w, r, b, h0, c0, op_type, direction, relu):
    directions = 2 if direction == "bidirectional" else 1
    y = x.new_empty((x.shape[0], directions, x.shape[1], r.shape[-1]))
    return y, h0.new_empty(h0.shape), h0.new_empty(0) if c0 is None else c0.new_empty(c0.shape)


@torch.library.custom_op("ort_torch_train::fused_recurrent_backward", mutates_args=())
def _backward_op(
    x: Tensor,
    w: Tensor,
    r: Tensor,
    b: Tensor | None,
    h0: Tensor,
    c0: Tensor | None,
    grad_y: Tensor,
    grad_h: Tensor,
    grad_c: Tensor,
    op_type: str,
    direction: str,
    relu: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of ``fused_kernel``'s inputs x, w, r, b, h0, c0 (those absent: empty tensors), contiguous."""
    with torch.enable_grad(), autograd_dispatch():  # the kernel runs below autograd
        inputs = [None if t is None else t.detach().requires_grad_() for t in (x, w, r, b, h0, c0)]
        x_, w_, r_, b_, h0_, c0_ = inputs
        assert x_ is not None and w_ is not None and r_ is not None and h0_ is not None
        y, y_h, y_c = fused_kernel(op_type, direction, relu, x_, w_, r_, b_, h0_, c0_)
        outputs = [(y, grad_y), (y_h, grad_h)] + ([] if y_c is None else [(y_c, grad_c)])
        present = [t for t in inputs if t is not None]
        grads = iter(torch.autograd.grad([o for o, _ in outputs], present, [g for _, g in outputs], allow_unused=True))
    found = [None if t is None else next(grads) for t in inputs]
    return tuple(  # type: ignore[return-value]
        x.new_empty(0) if t is None else t.new_zeros(t.shape) if g is None else g.contiguous()
        for t, g in zip(inputs, found)
    )


@_backward_op.register_fake
def _(x, w, r, b, h0, c0, grad_y, grad_h, grad_c, op_type, direction, relu):
    return tuple(x.new_empty(0) if t is None else t.new_empty(t.shape) for t in (x, w, r, b, h0, c0))


class _FusedRecurrent(torch.autograd.Function):
    """The forward op, with the backward op as its gradient (its inputs detached: the ops are opaque to autograd)."""

    @staticmethod
    def forward(
        x: Tensor,
        w: Tensor,
        r: Tensor,
        b: Tensor | None,
        h0: Tensor,
        c0: Tensor | None,
        settings: tuple[str, str, bool],
    ) -> tuple[Tensor, Tensor, Tensor]:
        return _forward_op(*(None if t is None else t.detach() for t in (x, w, r, b, h0, c0)), *settings)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        *tensors, settings = inputs
        ctx.present = tuple(t is not None for t in tensors)
        ctx.save_for_backward(*(t for t in tensors if t is not None))
        ctx.settings = settings

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor, grad_h: Tensor, grad_c: Tensor) -> tuple[Tensor | None, ...]:
        saved = iter(ctx.saved_tensors)
        tensors = [next(saved).detach() if present else None for present in ctx.present]
        grads = _backward_op(*tensors, grad_y.detach(), grad_h.detach(), grad_c.detach(), *ctx.settings)
        return (*(g if present else None for g, present in zip(grads, ctx.present)), None)


@written_whole
def fused_recurrent(
    op_type: str,
    direction: str,
    relu: bool,
    x: Tensor,
    w: Tensor,
    r: Tensor,
    b: Tensor | None,
    h0: Tensor,
    c0: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``fused_kernel`` as one opaque, differentiable call (what a compiled graph runs)."""
    y, y_h, y_c = _FusedRecurrent.apply(x, w, r, b, h0, c0, (op_type, direction, relu))
    return y, y_h, None if c0 is None else y_c
