"""Fusion passes for the normalisation and activation patterns exporters decompose.

* ``mean -> sub -> pow 2 -> mean -> add eps -> sqrt -> div [* w] [+ b]`` -> ``F.layer_norm``;
* ``pow 2 -> mean -> add eps -> sqrt -> reciprocal -> mul [* w]`` (T5/Llama RMSNorm) -> ``F.rms_norm``;
* ``x * sigmoid(x)`` -> ``F.silu``;
* ``x * 0.5 * (1 + erf(x / sqrt 2))`` and ``... (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` -> ``F.gelu``;
* the converters' LayerNormalization / Gelu modules -> plain ``F.layer_norm`` / ``F.gelu`` calls, and
  ORT's SimplifiedLayerNormalization / QuickGelu (alpha 1) -> ``F.rms_norm`` / ``F.silu``.

Each pass only matches nodes whose intermediate results have no other reader, so replacing the
last node of a pattern and dropping dead code removes the whole pattern.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.adapters.activations import Gelu, QuickGelu
from ort_torch_train.adapters.normalization import LayerNorm
from ort_torch_train.passes.match import args_of, is_call, known_val, only_user, val

_SQRT_2 = math.sqrt(2.0)
_TANH_GELU = math.sqrt(2.0 / math.pi)


def fuse_patterns(module: fx.GraphModule, counts: Counter) -> None:
    """Apply the norm and GELU fusions to ``module.graph`` in place, counting each in ``counts``."""
    graph = module.graph
    for node in list(graph.nodes):
        if getattr(node, "_erased", False):
            continue
        for name, fusion in _FUSIONS:
            if fusion(module, node):
                counts[name] += 1
                graph.eliminate_dead_code()  # the matched pattern, so later matches see true user counts
                break


def _close(value, expected: float) -> bool:
    return isinstance(value, (int, float)) and math.isclose(float(value), expected, rel_tol=1e-6)


def _other(node: fx.Node, known) -> object:
    """The argument of a two-argument ``node`` that is not ``known`` (None if neither is)."""
    first, second = args_of(node)
    return second if first is known else first if second is known else None


def _float_arg(node: fx.Node, target) -> tuple[fx.Node, float] | None:
    """``(x, c)`` for a ``target(x, c)`` or ``target(c, x)`` with a Python number ``c``."""
    if not is_call(node, target, 2):
        return None
    first, second = args_of(node)
    if isinstance(first, fx.Node) and isinstance(second, (int, float)):
        return first, float(second)
    if isinstance(second, fx.Node) and isinstance(first, (int, float)) and target in (torch.mul, torch.add):
        return second, float(first)
    return None


def _replace(graph: fx.Graph, last: fx.Node, function, args: tuple, kwargs: dict | None = None) -> None:
    with graph.inserting_before(last):
        fused = graph.call_function(function, args, kwargs or {})
    fused.meta["val"] = val(last)
    last.replace_all_uses_with(fused)


def _trailing_dims(node: fx.Node, x) -> tuple[int, ...] | None:
    """The normalised shape of ``mean(x, dims, keepdim=True)`` over the trailing dims, else None."""
    x_val = val(x)
    if (
        not is_call(node, torch.mean, 3)
        or args_of(node)[2] is not True
        or x_val is None
        or not x_val.is_floating_point()
    ):
        return None
    rank = x_val.dim()
    dims = sorted(d % rank for d in args_of(node)[1]) if isinstance(args_of(node)[1], (tuple, list)) else None
    if not dims or dims != list(range(rank - len(dims), rank)):
        return None
    return tuple(x_val.shape[rank - len(dims) :])


def _squared(node, x) -> bool:
    return (is_call(node, torch.pow, 2) and args_of(node)[0] is x and _close(args_of(node)[1], 2.0)) or (
        is_call(node, torch.mul, 2) and args_of(node)[0] is x and args_of(node)[1] is x
    )


def _inverse_sqrt_of(node) -> fx.Node | None:
    """For ``1 / sqrt(v)`` written as reciprocal, rtruediv or div: the sqrt node."""
    if is_call(node, torch.reciprocal, 1) or (is_call(node, "__rtruediv__", 2) and _close(args_of(node)[1], 1.0)):
        source = args_of(node)[0]
    elif is_call(node, torch.div, 2) and _close(args_of(node)[0], 1.0):
        source = args_of(node)[1]
    else:
        return None
    return source if is_call(source, torch.sqrt, 1) and len(source.users) == 1 else None


def _variance_epsilon(mean: fx.Node) -> tuple[fx.Node, float] | None:
    """For ``mean -> add eps -> sqrt`` (single users): (the sqrt node, eps)."""
    add = only_user(mean)
    if add is None:
        return None
    found = _float_arg(add, torch.add)
    if found is None or found[0] is not mean:
        return None
    sqrt = only_user(add)
    return (sqrt, found[1]) if is_call(sqrt, torch.sqrt, 1) else None


def _affine(graph_node: fx.Node, shape: tuple[int, ...], dtype: torch.dtype, with_bias: bool):
    """``(last node, weight, bias)`` after an optional ``* weight`` and (if allowed) ``+ bias`` of ``shape``."""
    last, weight, bias = graph_node, None, None
    for target, allowed in ((torch.mul, True), (torch.add, with_bias)):
        user = only_user(last)
        if not allowed or user is None or not is_call(user, target, 2) or last not in args_of(user):
            continue
        operand = _other(user, last)
        operand_val = val(operand)
        if operand_val is None or tuple(operand_val.shape) != shape or operand_val.dtype != dtype:
            continue
        if target is torch.mul:
            weight = operand
        else:
            bias = operand
        last = user
    return last, weight, bias


def _layer_norm_decomposed(module: fx.GraphModule, mean: fx.Node) -> bool:
    x = args_of(mean)[0] if is_call(mean, torch.mean, 3) else None
    shape = _trailing_dims(mean, x) if x is not None else None
    centred = only_user(mean) if shape is not None else None
    if centred is None or not (is_call(centred, torch.sub, 2) and args_of(centred) == (x, mean)):
        return False
    if len(centred.users) != 2:
        return False
    square = next((u for u in centred.users if _squared(u, centred)), None)
    divide = next((u for u in centred.users if is_call(u, torch.div, 2) and args_of(u)[0] is centred), None)
    variance = only_user(square) if square is not None and divide is not None else None
    if variance is None or divide is None or shape is None or _trailing_dims(variance, centred) != shape:
        return False
    found = _variance_epsilon(variance)
    if found is None or args_of(divide)[1] is not found[0]:
        return False
    last, weight, bias = _affine(divide, shape, known_val(x).dtype, with_bias=True)
    _replace(module.graph, last, F.layer_norm, (x, shape, weight, bias, found[1]))
    return True


def _rms_norm(module: fx.GraphModule, mean: fx.Node) -> bool:
    square = args_of(mean)[0] if is_call(mean, torch.mean, 3) else None
    if not isinstance(square, fx.Node) or len(square.users) != 1 or not args_of(square):
        return False
    if not isinstance(args_of(square)[0], fx.Node):
        return False
    x = args_of(square)[0]
    shape = _trailing_dims(mean, square) if _squared(square, x) else None
    found = _variance_epsilon(mean) if shape is not None else None
    if found is None or shape is None:
        return False
    sqrt, epsilon = found
    inverse = only_user(sqrt)
    if inverse is not None and _inverse_sqrt_of(inverse) is sqrt:
        scaled = only_user(inverse)
        if scaled is None or not (is_call(scaled, torch.mul, 2) and _other(scaled, inverse) is x):
            return False
    else:
        scaled = inverse
        if scaled is None or not (is_call(scaled, torch.div, 2) and args_of(scaled) == (x, sqrt)):
            return False
    last, weight, _ = _affine(scaled, shape, known_val(x).dtype, with_bias=False)
    _replace(module.graph, last, F.rms_norm, (x, shape, weight, epsilon))
    return True


def _gelu_tail(plus_one: fx.Node, x: fx.Node) -> fx.Node | None:
    """The last node of ``0.5 * x * plus_one`` in any association order, else None."""
    user = only_user(plus_one)
    if user is None or not is_call(user, torch.mul, 2) or plus_one not in args_of(user):
        return None
    factor = _other(user, plus_one)
    half = _float_arg(factor, torch.mul) if isinstance(factor, fx.Node) else None
    if (
        isinstance(factor, fx.Node)
        and half is not None
        and half[0] is x
        and _close(half[1], 0.5)
        and len(factor.users) == 1
    ):
        return user
    if factor is x:
        last = only_user(user)
        found = _float_arg(last, torch.mul) if last is not None else None
        return last if found is not None and found[0] is user and _close(found[1], 0.5) else None
    return None


def _plus_one(node: fx.Node) -> fx.Node | None:
    add = only_user(node)
    found = _float_arg(add, torch.add) if add is not None else None
    return add if found is not None and found[0] is node and _close(found[1], 1.0) else None


def _scaled_input(node) -> tuple[fx.Node, float] | None:
    """``(x, c)`` for ``x * c`` or ``x / (1/c)`` with single use."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return None
    found = _float_arg(node, torch.mul)
    if found is not None:
        return found
    found = _float_arg(node, torch.div)
    return (found[0], 1.0 / found[1]) if found is not None and found[1] != 0.0 else None


def _gelu_erf(module: fx.GraphModule, erf: fx.Node) -> bool:
    if not is_call(erf, torch.erf, 1):
        return False
    scaled = _scaled_input(args_of(erf)[0])
    if scaled is None or not _close(scaled[1], 1.0 / _SQRT_2):
        return False
    x = scaled[0]
    plus_one = _plus_one(erf)
    last = _gelu_tail(plus_one, x) if plus_one is not None else None
    if last is None:
        return False
    _replace(module.graph, last, F.gelu, (x,))
    return True


def _gelu_tanh(module: fx.GraphModule, tanh: fx.Node) -> bool:
    if not is_call(tanh, torch.tanh, 1):
        return False
    scaled = _scaled_input(args_of(tanh)[0])
    if scaled is None or not _close(scaled[1], _TANH_GELU) or not is_call(scaled[0], torch.add, 2):
        return False
    inner = scaled[0]
    if len(inner.users) != 1:
        return False
    x = next((arg for arg in args_of(inner) if _is_cubic_term(_other(inner, arg), arg)), None)
    plus_one = _plus_one(tanh) if x is not None else None
    last = _gelu_tail(plus_one, x) if plus_one is not None and x is not None else None
    if last is None:
        return False
    _replace(module.graph, last, F.gelu, (x,), {"approximate": "tanh"})
    return True


def _is_cubic_term(node, x) -> bool:
    """Whether ``node`` is ``0.044715 * x**3`` (single use)."""
    scaled = _scaled_input(node)
    if scaled is None or not _close(scaled[1], 0.044715):
        return False
    cube = scaled[0]
    return (
        len(cube.users) == 1 and is_call(cube, torch.pow, 2) and args_of(cube)[0] is x and _close(args_of(cube)[1], 3.0)
    )


def _silu(module: fx.GraphModule, sigmoid: fx.Node) -> bool:
    """``x * sigmoid(x)`` -> ``F.silu(x)``."""
    if not is_call(sigmoid, torch.sigmoid, 1):
        return False
    x, product = args_of(sigmoid)[0], only_user(sigmoid)
    if product is None or not is_call(product, torch.mul, 2) or _other(product, sigmoid) is not x:
        return False
    _replace(module.graph, product, F.silu, (x,))
    return True


def _module_call(module: fx.GraphModule, node: fx.Node) -> bool:
    """A LayerNormalization (one output, full-size scale/bias) or Gelu module call -> the functional call."""
    if node.op != "call_module" or node.kwargs:
        return False
    submodule = module.get_submodule(str(node.target))
    x_val = val(args_of(node)[0]) if args_of(node) else None
    if x_val is None or not x_val.is_floating_point():
        return False
    if isinstance(submodule, Gelu) and len(args_of(node)) == 1:
        _replace(module.graph, node, F.gelu, args_of(node), {"approximate": submodule.approximate})
        return True
    if isinstance(submodule, QuickGelu) and len(args_of(node)) == 1 and submodule.alpha == 1.0:  # ORT's fused SiLU
        _replace(module.graph, node, F.silu, args_of(node))
        return True
    if not isinstance(submodule, LayerNorm) or submodule.outputs != 1 or len(args_of(node)) not in (2, 3):
        return False
    shape = tuple(x_val.shape[submodule.axis % x_val.dim() :])
    operands = [val(arg) for arg in args_of(node)[1:]]
    if any(v is None or tuple(v.shape) != shape or v.dtype != x_val.dtype for v in operands):
        return False
    x, weight, *bias = args_of(node)
    if submodule.simplified:  # ORT's SimplifiedLayerNormalization: RMSNorm, statistics in float32
        if x_val.dtype != torch.float32 or bias:
            return False
        _replace(module.graph, node, F.rms_norm, (x, shape, weight, submodule.epsilon))
        return True
    _replace(module.graph, node, F.layer_norm, (x, shape, weight, bias[0] if bias else None, submodule.epsilon))
    return True


_FUSIONS = (
    ("layer_norm", _layer_norm_decomposed),
    ("rms_norm", _rms_norm),
    ("gelu", _gelu_erf),
    ("gelu", _gelu_tanh),
    ("silu", _silu),
    ("module_to_function", _module_call),
)
