"""Patch convolutions in compiled graphs as a matrix product of a row-major patches tensor.

A 2-D convolution whose kernel equals its stride, without padding or dilation and with one group (a
vision transformer's patch embedding, a ConvNeXt stem) reads each pixel once: the patches, laid out as
rows, times the kernel as a matrix. torch.compile asks torch which convolution backend the sizes' hints
choose (in the fake-tensor convolution and in inductor's lowering), and the choice depends on the batch
being over 1: a step compiled for batches >= 2 then rejects batch 1 and compiles again.
``patch_products`` rewrites such convolutions of a compiled graph into ``patches_product``, the same
values with nothing decided on the sizes. Eager graphs keep the convolution.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import Tensor, fx

from ort_torch_train.adapters.conv import Conv
from ort_torch_train.passes.match import args_of, replace_with_call, val
from ort_torch_train.passes.meta_keys import FUSIONS


def patches_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.conv2d(x, weight, bias, stride=kernel)`` (N, C, H, W) -> (N, O, H // kh, W // kw), as the kernel
    (a matrix) times each image's non-overlapping patches, copied row-major as columns; the result is
    row-major, as the convolution's is (under autocast, the convolution itself: its dtypes follow
    autocast's rules)."""
    if torch.is_autocast_enabled(x.device.type):
        return F.conv2d(x, weight, bias, stride=weight.shape[2:])
    batch = x.shape[0]
    out_channels, _, kernel_h, kernel_w = weight.shape
    windows = x.unfold(2, kernel_h, kernel_h).unfold(3, kernel_w, kernel_w)  # N, C, H', W', kh, kw
    rows, columns = windows.shape[2], windows.shape[3]
    patches = windows.permute(0, 1, 4, 5, 2, 3).clone(memory_format=torch.contiguous_format)
    kernel = weight.reshape(1, out_channels, -1).expand(batch, -1, -1)
    out = torch.bmm(kernel, patches.view(batch, kernel.shape[2], rows * columns))  # N, O, H' W'
    if bias is not None:
        out = out + bias.view(1, out_channels, 1)
    return out.view(batch, out_channels, rows, columns)


def patch_products(module: fx.GraphModule, device: torch.device) -> None:
    """``module``'s patch convolutions rewritten to ``patches_product`` (in place, for torch.compile); the
    count is added to ``module``'s ``FUSIONS``."""
    rewritten = 0
    for node in list(module.graph.nodes):
        if node.op != "call_module" or node.kwargs or not _is_patch_conv(module.get_submodule(str(node.target)), node):
            continue
        replace_with_call(module.graph, node, patches_product, args_of(node))
        rewritten += 1
    if rewritten:
        FUSIONS.setdefault(module, Counter())["patch_products"] += rewritten


def _is_patch_conv(conv: torch.nn.Module, node: fx.Node) -> bool:
    """Whether ``conv`` (called by ``node``) is a 2-D convolution of one group whose kernel equals its
    strides, without padding or dilation, on a floating-point input."""
    if not isinstance(conv, Conv) or conv.conv is not F.conv2d or len(node.args) not in (2, 3):
        return False
    x, weight = val(node.args[0]), val(node.args[1])
    return (
        x is not None
        and weight is not None
        and x.is_floating_point()
        and x.dim() == 4
        and weight.dim() == 4
        and conv.groups == 1
        and tuple(conv.strides) == tuple(weight.shape[2:])
        and conv.dilations == (1, 1)
        and not any(conv.pad)
    )
