"""Float32 CPU GEMMs (forward and backward) on oneDNN instead of torch's BLAS: eager and compiled.

torch's CPU build sends float32 ``mm`` to MKL, which on AMD CPUs takes a slower path than oneDNN's
or ORT's own GEMM (``bench/experiments/gemm_backends.py``; docs/performance.md). ``linear`` sends large enough float32 CPU products, outside autocast, to
oneDNN (``torch.ops.mkldnn._linear_pointwise``, the kernel inductor uses for frozen weights) through
the ``ort_torch_train::onednn_linear`` custom op (opaque to torch.compile), whose backward is two more
oneDNN products. Everything else stays ``F.linear``, small products too: there the custom op's
dispatch and oneDNN's primitive setup cost more than they save.

Compiled graphs get the same through ``cpu_matmuls()``, an inductor post-grad pass
(``training/compile/settings.py`` adds it on CPU): torch.func.grad, which traces the one-graph step, cannot
differentiate the Function inside torch.compile, but its differentiated graph's ``mm``/``addmm`` can
be sent to the custom op afterwards (the same pass splits small ``addmm`` into ``mm`` and a fused add).
Results agree with ``F.linear`` to float32 rounding (a different summation order).
``ORT_TORCH_TRAIN_ONEDNN_LINEAR=0`` turns oneDNN off in both.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from ort_torch_train.passes import unfused_addmm
from ort_torch_train.passes.match import args_of
from ort_torch_train.torch_internals import (
    GraphPass,
    assume_constant_result,
    custom_graph_pass,
    hash_of_files,
    in_functorch_transform,
    onednn_linear_pointwise,
)

# multiply-accumulates from which oneDNN's setup pays off (bench/experiments/gemm_backends.py)
MIN_MACS = 1 << 22
# eager calls also pay the autograd Function's Python, so eager graphs use oneDNN only from a larger size
EAGER_MIN_MACS = 1 << 24


@assume_constant_result  # read when traced, a constant of the compiled graph
def enabled() -> bool:
    """Whether oneDNN products are on: available in this torch build and not turned off by
    ``ORT_TORCH_TRAIN_ONEDNN_LINEAR=0``."""
    return os.environ.get("ORT_TORCH_TRAIN_ONEDNN_LINEAR", "1") != "0" and torch.backends.mkldnn.is_available()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, on oneDNN for large float32 CPU products outside autocast."""
    if _use_onednn(x, weight, bias):
        return _OneDnnLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


# what a converted graph's linear layers call: F.linear, retargeted to ``linear`` where large (use_onednn_linear)
LINEARS = (F.linear, linear)


def _use_onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    if not enabled() or x.device.type != "cpu" or weight.device.type != "cpu" or weight.dim() != 2 or x.dim() < 2:
        return False
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        return False
    if torch.is_autocast_enabled("cpu") or in_functorch_transform():
        return False  # autocast casts F.linear; compiled torch.func transforms mis-differentiate the Function
    return x.numel() * weight.shape[0] >= EAGER_MIN_MACS


@torch.library.custom_op("ort_torch_train::onednn_linear", mutates_args=(), device_types="cpu")
def _onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T (+ bias)`` on oneDNN; strided ``x`` and ``weight`` are read as they are."""
    return onednn_linear_pointwise(x, weight, bias)


@_onednn_linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The oneDNN product: the custom op where torch.compile traces it, else its kernel called directly
    (the op's eager call goes through a Dynamo-disabling wrapper, which imports Dynamo)."""
    if torch.compiler.is_compiling():
        return _onednn_linear(x, weight, bias)
    return onednn_linear_pointwise(x, weight, bias)


class _OneDnnLinear(torch.autograd.Function):
    """The custom op with its backward as two more oneDNN products (eager graphs; compiled ones use the pass)."""

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return _product(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: Tensor) -> None:
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad, weight.t(), None)  # grad @ weight
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_weight = _product(rows.t(), x.reshape(-1, x.shape[-1]).t(), None)  # grad.T @ x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(0)
        return grad_x, grad_weight, grad_bias


def use_onednn_linear(module: torch.fx.GraphModule) -> int:
    """Point the float32 ``F.linear`` calls of ``module.graph`` that are large enough at ``linear``; how many."""
    count = 0
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target is not F.linear or node.kwargs or len(node.args) < 2:
            continue
        x, weight = (arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None for arg in node.args[:2])
        if x is None or weight is None or x.dtype != torch.float32 or weight.dim() != 2:
            continue
        if x.numel() * weight.shape[0] >= EAGER_MIN_MACS:
            node.target = linear
            count += 1
    return count


def cpu_matmuls() -> GraphPass:
    """Inductor post-grad pass over float32 CPU ``mm``/``addmm`` (forward and backward, after AOTAutograd
    has differentiated the graph): large products -> the oneDNN custom op (what compiled graphs get
    instead of ``linear``); small ``addmm`` -> ``mm`` and an add that inductor fuses into the loop reading
    the product (``unfused_addmm.py``: BLAS otherwise copies the bias into the output first). One instance, keyed
    in inductor's caches by this file's and ``unfused_addmm.py``'s hashes and whether oneDNN is enabled."""
    return custom_graph_pass("CpuMatmuls", _rewrite_matmuls, _matmuls_uuid)


def _rewrite_matmuls(graph: torch.fx.Graph) -> None:
    from torch.fx.experimental import symbolic_shapes

    onednn = enabled()
    for node in list(graph.nodes):
        operands = _matmul_operands(node)
        if operands is None:
            continue
        a, b, bias = operands
        # a product over a size read from data (the tokens routed to one expert) counts as small
        large = symbolic_shapes.guard_or_false(_macs(a, b) >= MIN_MACS)
        if (large and not onednn) or (not large and bias is None):
            continue
        with graph.inserting_before(node):
            if large:
                transposed = graph.call_function(torch.ops.aten.permute.default, (b, [1, 0]))
                transposed.meta["val"] = b.meta["val"].t()
                product = graph.call_function(torch.ops.ort_torch_train.onednn_linear.default, (a, transposed, bias))
                product.meta = dict(node.meta)
            else:
                assert bias is not None  # a small mm was left as it is above
                product = unfused_addmm.unfused_product(graph, node, a, b, bias)
        node.replace_all_uses_with(product)
        graph.erase_node(node)


def _matmuls_uuid() -> bytes:
    return hash_of_files((__file__, unfused_addmm.__file__)) + bytes([enabled()])


def _matmul_operands(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node | None] | None:
    """``(a, b, bias)`` of a float32 CPU ``mm(a, b)`` or ``addmm(bias, a, b)`` with a 1-D bias."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    if node.target is aten.mm.default:
        (a, b), bias = args_of(node), None
    else:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, a, b = args_of(node)
        bias_val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
        if bias_val is None or bias_val.dim() != 1 or bias_val.dtype != torch.float32:
            return None
    a_val, b_val = (arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None for arg in (a, b))
    if a_val is None or b_val is None or a_val.device.type != "cpu":
        return None
    if a_val.dtype != torch.float32 or b_val.dtype != torch.float32:
        return None
    return a, b, bias


def _macs(a: torch.fx.Node, b: torch.fx.Node) -> int:
    a_val, b_val = a.meta["val"], b.meta["val"]
    return a_val.shape[0] * a_val.shape[1] * b_val.shape[1]
