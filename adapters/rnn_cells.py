"""Per-timestep RNN/GRU/LSTM kernels for what torch's fused recurrent ops cannot express.

ONNX semantics (gate orders: GRU ``zrh``, LSTM ``iofc``): any activations, ``clip`` on the gate
pre-activations, LSTM peepholes and ``input_forget``, GRU ``linear_before_reset=0`` and per-batch
``sequence_lens`` (steps past a sequence's length keep its state and output zeros; an empty
sequence ends in zero states, as in onnxruntime). Tensors are in layout 0: ``x [seq, batch, input]``,
states ``[batch, hidden]`` per direction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ort_torch_train.errors import UnsupportedOperatorError

# name -> (function of (x, alpha, beta), default alpha or None if unused, default beta or None if unused)
_ACTIVATIONS: dict[str, tuple[Callable[..., torch.Tensor], float | None, float | None]] = {
    "sigmoid": (lambda x, a, b: torch.sigmoid(x), None, None),
    "tanh": (lambda x, a, b: torch.tanh(x), None, None),
    "relu": (lambda x, a, b: torch.relu(x), None, None),
    "softsign": (lambda x, a, b: F.softsign(x), None, None),
    "softplus": (lambda x, a, b: F.softplus(x), None, None),
    "leakyrelu": (lambda x, a, b: F.leaky_relu(x, a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: torch.where(x > a, x, torch.zeros_like(x)), 1.0, None),
    "elu": (lambda x, a, b: F.elu(x, a), 1.0, None),
    "hardsigmoid": (lambda x, a, b: torch.clamp(a * x + b, 0.0, 1.0), 0.2, 0.5),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "scaledtanh": (lambda x, a, b: a * torch.tanh(b * x), 1.0, 1.0),
}


@dataclass(frozen=True)
class ActivationSpec:
    """One activation function of an RNN node, with its alpha/beta."""

    name: str
    alpha: float | None = None
    beta: float | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _ACTIVATIONS[self.name][0](x, self.alpha, self.beta)


def activation_specs(
    op_type: str, names: Sequence[str], alphas: Sequence[float], betas: Sequence[float]
) -> list[ActivationSpec]:
    """The node's activations; alphas/betas are consumed in order by the functions that use them."""
    alpha_values, beta_values = iter(alphas), iter(betas)
    specs = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise UnsupportedOperatorError(
                f"{op_type}: attribute activations holds {name!r}; supported: {sorted(_ACTIVATIONS)}"
            )
        _, alpha, beta = _ACTIVATIONS[key]
        specs.append(
            ActivationSpec(
                key,
                None if alpha is None else float(next(alpha_values, alpha)),
                None if beta is None else float(next(beta_values, beta)),
            )
        )
    return specs


def _clip(x: torch.Tensor, clip: float | None) -> torch.Tensor:
    return x if clip is None else torch.clamp(x, -clip, clip)


def _masked(step: int, lengths: torch.Tensor | None) -> torch.Tensor | None:
    return None if lengths is None else (step < lengths).unsqueeze(-1)


def _keep(mask: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return new if mask is None else torch.where(mask, new, old)


def recurrent_direction(
    op_type: str,
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h: torch.Tensor,
    c: torch.Tensor | None,
    p: torch.Tensor | None,
    lengths: torch.Tensor | None,
    *,
    reverse: bool,
    activations: Sequence[ActivationSpec],
    clip: float | None,
    linear_before_reset: bool,
    input_forget: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One direction of an ONNX RNN/GRU/LSTM: ``(Y [seq, batch, hidden], Y_h, Y_c)``.

    ``w [G*hidden, input]``, ``r [G*hidden, hidden]``, ``b [2*G*hidden]``, ``p [3*hidden]``.
    """
    input_bias, recurrence_bias = b.chunk(2) if b is not None else (None, None)
    projected = _input_projection(x, w, input_bias)
    hidden = r.shape[-1]
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    zeros = torch.zeros_like(h)
    outputs = [zeros] * x.shape[0]  # every step's output replaces its placeholder
    for step in steps:
        mask = _masked(step, lengths)
        if op_type == "RNN":
            new_h = activations[0](_clip(projected[step] + F.linear(h, r, recurrence_bias), clip))
        elif op_type == "GRU":
            new_h = _gru_step(projected[step], h, r, recurrence_bias, hidden, activations, clip, linear_before_reset)
        else:
            assert c is not None, "an LSTM has a cell state"
            new_h, new_c = _lstm_step(
                projected[step] + F.linear(h, r, recurrence_bias), c, p, hidden, activations, clip, input_forget
            )
            c = _keep(mask, new_c, c)
        h = _keep(mask, new_h, h)
        outputs[step] = _keep(mask, new_h, zeros)
    if lengths is not None:  # as onnxruntime: an empty sequence's final states are zeros
        empty = (lengths == 0).unsqueeze(-1)
        h = torch.where(empty, zeros, h)
        c = None if c is None else torch.where(empty, zeros, c)
    return torch.stack(outputs), h, c


def _input_projection(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, w, bias)``, every step's input projection at once; a contiguous ``x`` as the product of
    its rows that F.linear makes of it, written out: F.linear's own folding, traced by make_fx under
    ``torch.func.grad`` (a package's step), keeps ``x`` as a constant of the traced graph."""
    if not x.is_contiguous():
        return F.linear(x, w, bias)
    return F.linear(x.reshape(-1, x.shape[-1]), w, bias).reshape(*x.shape[:-1], w.shape[0])


def _gru_step(projected, h, r, recurrence_bias, hidden, activations, clip, linear_before_reset):
    f, g = activations
    x_z, x_r, x_h = projected.split(hidden, dim=-1)
    bias_zr, bias_h = (None, None) if recurrence_bias is None else recurrence_bias.split((2 * hidden, hidden))
    h_z, h_r = F.linear(h, r[: 2 * hidden], bias_zr).split(hidden, dim=-1)
    z = f(_clip(x_z + h_z, clip))
    reset = f(_clip(x_r + h_r, clip))
    if linear_before_reset:
        candidate = reset * F.linear(h, r[2 * hidden :], bias_h)
    else:
        candidate = F.linear(reset * h, r[2 * hidden :], bias_h)
    n = g(_clip(x_h + candidate, clip))
    return (1 - z) * n + z * h


def _lstm_step(gates, c, p, hidden, activations, clip, input_forget):
    f, g, h_act = activations
    i, o, forget, cell = gates.split(hidden, dim=-1)
    p_i, p_o, p_f = p.split(hidden) if p is not None else (None, None, None)
    i = f(_clip(i if p is None else i + p_i * c, clip))
    forget = 1 - i if input_forget else f(_clip(forget if p is None else forget + p_f * c, clip))
    new_c = forget * c + i * g(_clip(cell, clip))
    o = f(_clip(o if p is None else o + p_o * new_c, clip))
    return o * h_act(new_c), new_c
