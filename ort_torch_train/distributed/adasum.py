"""Adasum gradient combination (Maleki et al., "Scaling Distributed Training with Adaptive Summation",
2021) as a DDP communication hook, instead of averaging.

Two gradients a and b combine as ``(1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b`` (a zero-norm
side keeps its coefficient 1), per parameter tensor as in ORT and Horovod, with the dot products and
the combination in float64. The ranks combine in a binary tree by recursive doubling: at level
``d = 1, 2, 4, ...`` each rank exchanges its partial result with rank ``r ^ d`` and both combine the
pair with the lower rank's as ``a``, so every rank ends with the same bits. The tree needs a
power-of-two world size: ``check_world_size`` refuses any other on every rank before the first step.
"""
# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ort_torch_train.errors import DistributedError

GRADIENT_COMBINATIONS = ("average", "adasum")


def check_gradient_combination(value: object) -> str:
    """``value`` when it names a gradient combination; raises ValueError naming the choices otherwise."""
    if value not in GRADIENT_COMBINATIONS:
        raise ValueError(f"gradient_combination: expected one of {GRADIENT_COMBINATIONS}, got {value!r}")
    return str(value)


def check_world_size(world_size: int, rank: int) -> None:
    """Raise when Adasum's binary tree cannot span ``world_size`` ranks (not a power of two)."""
    if world_size < 1 or world_size & (world_size - 1):
        raise DistributedError(
            f"gradient_combination='adasum' combines ranks in a binary tree: expected a power-of-two world "
            f"size (1, 2, 4, 8, ...), got {world_size} (rank {rank}); use 'average' or launch "
            f"{1 << (world_size.bit_length() - 1)} or {1 << world_size.bit_length()} processes"
        )


def adasum_pair(a: Tensor, b: Tensor) -> Tensor:
    """The Adasum combination of two float64 vectors of the same shape."""
    dot = torch.dot(a, b)
    a_norm, b_norm = torch.dot(a, a), torch.dot(b, b)
    a_coefficient = torch.where(a_norm > 0, 1 - dot / (2 * a_norm), torch.ones_like(dot))
    b_coefficient = torch.where(b_norm > 0, 1 - dot / (2 * b_norm), torch.ones_like(dot))
    return a_coefficient * a + b_coefficient * b


def adasum_tensors(mine: Sequence[Tensor], theirs: Sequence[Tensor]) -> list[Tensor]:
    """Adasum per tensor of two lists of float64 vectors (``mine`` the lower rank's)."""
    return [adasum_pair(a, b) for a, b in zip(mine, theirs)]


def adasum_combine(flat: Tensor, sizes: Sequence[int], group: Any) -> Tensor:
    """Every rank's ``flat`` (tensors of ``sizes`` concatenated) combined by Adasum over ``group``, in
    ``flat``'s dtype: the same on every rank."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    check_world_size(world_size, rank)
    partial = flat.detach().to(torch.float64)
    level = 1
    while level < world_size:
        peer = rank ^ level
        received = torch.empty_like(partial)
        global_peer = dist.get_global_rank(group, peer) if group is not dist.group.WORLD else peer
        requests = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, partial, global_peer, group),
                dist.P2POp(dist.irecv, received, global_peer, group),
            ]
        )
        for request in requests:
            request.wait()
        lower, upper = (partial, received) if rank < peer else (received, partial)
        partial = torch.cat(adasum_tensors(lower.split(list(sizes)), upper.split(list(sizes))))
        level *= 2
    return partial.to(flat.dtype)


def adasum_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """DDP communication hook (``DistributedDataParallel.register_comm_hook(group, adasum_hook)``): the
    bucket's gradients combined by Adasum per parameter across ``group`` (None: the default group)."""
    group = dist.group.WORLD if group is None else group
    buffer = bucket.buffer()
    sizes = [gradient.numel() for gradient in bucket.gradients()]
    future: torch.futures.Future[Tensor] = torch.futures.Future()
    future.set_result(adasum_combine(buffer, sizes, group))
    return future
