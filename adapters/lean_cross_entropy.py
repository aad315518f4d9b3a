"""Softmax cross-entropy that keeps no log-probabilities: a language model's ``[B, V, T]`` scores are
reduced a block of positions at a time, and the backward writes the one gradient tensor directly.

``F.log_softmax`` + ``F.nll_loss`` hold the ``[B, V, T]`` log-probabilities for the backward and make two
more tensors of that size there (the gradient of the log-probabilities and of the scores); at a vocabulary
of 128256 each is as large as the logits. Here the forward keeps one log-sum-exp per position, and the
backward computes ``softmax - one_hot`` per block of positions into the gradient it returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch

BLOCK_ELEMENTS = 1 << 20  # score elements reduced at a time: 4 MiB in float32
LEAN_FROM_ELEMENTS = 1 << 22  # smaller scores (classifiers) keep log_softmax + nll_loss: torch's rounding


def pays_for(scores: torch.Tensor) -> bool:
    """Whether ``scores`` are large enough for the lean loss (``LEAN_FROM_ELEMENTS``)."""
    return scores.numel() >= LEAN_FROM_ELEMENTS


def _row_blocks(classes_last: torch.Tensor) -> Iterator[tuple[int | slice, ...]]:
    """Index tuples over ``classes_last`` (``[..., positions, C]``) selecting ``[rows, C]`` blocks of at
    most ``BLOCK_ELEMENTS`` scores (at least one row), without copying."""
    *outer, positions, classes = classes_last.shape
    rows = max(1, BLOCK_ELEMENTS // max(classes, 1))
    for index in itertools.product(*(range(d) for d in outer)):
        for start in range(0, positions, rows):
            yield (*index, slice(start, min(start + rows, positions)))


class LeanSoftmaxCrossEntropy(torch.autograd.Function):
    """The mean (or sum) over the positions whose label is not ``ignore_index`` of ``-log_softmax(scores,
    1)[label]``; scores ``[N, C, d...]``, labels ``[N, d...]``."""

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, labels: torch.Tensor, ignore_index: int, reduction: str):
        classes_last = scores.movedim(1, -1)  # [N, C] stays as it is: N positions
        labels = labels.reshape(classes_last.shape[:-1]).long()
        valid = labels != ignore_index
        safe = torch.where(valid, labels, 0)
        if bool(((safe < 0) | (safe >= classes_last.shape[-1])).any()):
            raise IndexError("Target is out of bounds")  # as torch's nll_loss; the converter names the input
        top = torch.empty(classes_last.shape[:-1], dtype=scores.dtype, device=scores.device)
        shifted_log_sum, shifted_picked = torch.empty_like(top), torch.empty_like(top)
        for index in _row_blocks(classes_last):  # as log_softmax: log(sum(exp(x - max))) - (x[label] - max)
            block = classes_last[index]
            top[index] = block.amax(-1)
            shifted = block - top[index].unsqueeze(-1)
            shifted_picked[index] = shifted.gather(-1, safe[index].unsqueeze(-1)).squeeze(-1)
            shifted_log_sum[index] = shifted.exp_().sum(-1).log_()
            del shifted  # before the next block's
        losses = torch.where(valid, shifted_log_sum - shifted_picked, 0.0)
        count = valid.sum()
        loss = losses.sum() if reduction == "sum" else losses.sum() / count
        ctx.save_for_backward(scores, safe, valid, top, shifted_log_sum, count)
        ctx.reduction = reduction
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        scores, safe, valid, top, shifted_log_sum, count = ctx.saved_tensors
        classes_last = scores.movedim(1, -1)
        scale = grad if ctx.reduction == "sum" else grad / count
        weights = valid.to(scores.dtype) * scale
        result = torch.empty(classes_last.shape, dtype=scores.dtype, device=scores.device)
        for index in _row_blocks(classes_last):  # exp(log_softmax) * w - one_hot * w, as log_softmax's backward
            block = result[index]
            torch.sub(classes_last[index], top[index].unsqueeze(-1), out=block)
            block.sub_(shifted_log_sum[index].unsqueeze(-1)).exp_().mul_(weights[index].unsqueeze(-1))
            block.scatter_add_(-1, safe[index].unsqueeze(-1), -weights[index].unsqueeze(-1))
        return result.movedim(-1, 1), None, None, None
