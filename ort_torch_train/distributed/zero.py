"""ZeRO stage 1: the optimizer state sharded element-wise across the ranks of a data-parallel group.

The trainable parameters, flattened and concatenated in the training graph's order, are cut into
``world_size`` contiguous slices of equal length (the last one padded). A rank keeps the moments of
its own slice only (about 1/world_size of them, whatever the parameters' sizes) and updates that
slice with the ORT-exact kernels, which are element-wise; then one ``all_gather`` brings every rank
the whole updated parameter space. What is not element-wise: the gradient-norm clip sums the squared
norms of the slices across ranks (one all-reduce); fp16 loss scaling agrees on the inf/nan skip
across ranks (``LossScaler.process_group``); the step count is one per optimizer, as in ORT.

``ShardedTensors`` is the OptimizerEngine's tensor provider (``optim/tensor_lists.py``) that does this:
the engine runs its algorithm's kernel on the slices it gives and calls it after each update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ort_torch_train.errors import CheckpointError, DistributedError
from ort_torch_train.optim.algorithm import OptimizerAlgorithm
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.tensor_lists import KernelTensors, gradient_buffers, optimizer_group, trainable_parameter
from ort_torch_train.state.training_state import TrainingState

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13


class FlatShard:
    """This rank's contiguous slice of a list of tensors flattened end to end, and the collective
    that reassembles the whole from every rank's slice."""

    def __init__(self, numels: Sequence[int], group: Any) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.numels = list(numels)
        total = sum(self.numels)
        self.shard_size = -(-total // self.world_size)
        low, high = self.rank * self.shard_size, min((self.rank + 1) * self.shard_size, total)
        self.pieces: list[tuple[int, int, int]] = []  # (tensor index, first element, end element) owned
        offset = 0
        for index, numel in enumerate(self.numels):
            start, stop = max(low, offset), min(high, offset + numel)
            if start < stop:
                self.pieces.append((index, start - offset, stop - offset))
            offset += numel
        self.owned_size = max(0, high - low)
        self._buffers: dict[tuple[torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}

    def owned(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """Views of this rank's pieces of ``tensors`` (contiguous, in order), flattened."""
        return [tensors[index].view(-1)[start:stop] for index, start, stop in self.pieces]

    def gather(self, pieces: Sequence[Tensor], like: Tensor) -> list[Tensor]:
        """Every rank's ``pieces`` reassembled: one flat tensor per original tensor (views of one new
        buffer). A collective: every rank of the group calls it."""
        return self._gathered(pieces, *self._new_buffers(like))

    def gather_into(self, wholes: Sequence[Tensor], pieces: Sequence[Tensor]) -> None:
        """Copy every rank's ``pieces`` into ``wholes`` (the flattened tensors; buffers reused). A collective."""
        key = (pieces[0].dtype, pieces[0].device)
        if key not in self._buffers:
            self._buffers[key] = self._new_buffers(pieces[0])
        torch._foreach_copy_(list(wholes), self._gathered(pieces, *self._buffers[key]))

    def _new_buffers(self, like: Tensor) -> tuple[Tensor, Tensor]:
        send = torch.zeros(self.shard_size, dtype=like.dtype, device=like.device)
        return send, torch.empty(self.shard_size * self.world_size, dtype=like.dtype, device=like.device)

    def _gathered(self, pieces: Sequence[Tensor], send: Tensor, whole: Tensor) -> list[Tensor]:
        if pieces:
            torch.cat(list(pieces), out=send[: self.owned_size])
        _all_gather(whole, send, group=self.group)
        return list(whole[: sum(self.numels)].split(self.numels))


class ShardedTensors:
    """An OptimizerEngine's tensor provider for ZeRO stage 1: this rank's slices of the trainable
    tensors and of their moments, across ``group``; after each update, every rank's slices gathered."""

    fuses_into_step = False  # a compiled train step runs forward, backward and reduction; the update runs here

    def __init__(self, state: TrainingState, param_names: Sequence[str], group: Any) -> None:
        params = [state.params[name] for name in param_names]
        if len({(p.dtype, p.device) for p in params}) > 1:
            raise DistributedError(
                "Optimizer(shard_state=True): the trainable parameters must share one dtype "
                f"and device; found {sorted({f'{p.dtype} on {p.device}' for p in params})}"
            )
        self.shard = FlatShard([p.numel() for p in params], group)
        if not self.shard.pieces:
            raise DistributedError(
                f"Optimizer(shard_state=True): rank {self.shard.rank} of "
                f"{self.shard.world_size} owns no element: the model has "
                f"{sum(self.shard.numels)} trainable elements; use fewer ranks or "
                "shard_state=False"
            )
        self.group = group
        self._whole_params: list[Tensor] = []  # the flattened parameters the gathered slices go to
        self._stored: dict[str, list[Tensor]] = {}  # stored moment name -> this rank's slices of it

    def kernel_tensors(
        self, state: TrainingState, param_names: Sequence[str], algorithm: OptimizerAlgorithm
    ) -> KernelTensors:
        """This rank's slices; a checkpoint's whole moments are cut to them (``TensorProvider``)."""
        if not algorithm.elementwise:
            raise DistributedError(
                f"Optimizer(shard_state=True): {algorithm.display_name}'s update is not element-wise, "
                "so its state cannot be sharded; use shard_state=False"
            )
        params = [trainable_parameter(state, name) for name in param_names]
        self._whole_params = [param.detach().view(-1) for param in params]
        momentums = optimizer_group(state).momentums
        owned_names = [param_names[index] for index, _, _ in self.shard.pieces]
        fresh = not momentums  # no moments yet: zeros, as in ORT
        owned = {}
        for (index, start, stop), name in zip(self.shard.pieces, owned_names):
            param = params[index].detach()
            owned[name] = (
                {key: param.new_zeros(stop - start) for key in algorithm.stored_moments}
                if fresh
                else _owned_moments(name, param, start, stop, momentums.get(name), algorithm.stored_moments)
            )
        state.set_moments(owned, only=True)
        self._stored = {key: [momentums[name][key] for name in owned_names] for key in algorithm.stored_moments}
        return KernelTensors(
            self.shard.owned([param.detach() for param in params]),
            self.shard.owned(gradient_buffers(params)),
            [self._stored[key] for key in algorithm.updated_moments],
        )

    def clip_gradients(self, grads: list[Tensor], max_norm: float) -> None:
        """Clip by the norm of every rank's slices together (one all-reduce)."""
        clip_grad_norm_(grads, max_norm, group=self.group)

    def after_step(self, tensors: KernelTensors) -> None:
        """Gather every rank's updated slices into the whole parameters (a collective)."""
        with torch.no_grad():
            self.shard.gather_into(self._whole_params, tensors.params)

    def gathered_momentums(self, engine: OptimizerEngine) -> dict[str, dict[str, Tensor]]:
        """Every parameter's whole moments, gathered from the slices of ``engine`` (whose tensor provider
        this is). A collective: all ranks call it."""
        like = engine.tensor_lists().params[0]
        full: dict[str, dict[str, Tensor]] = {name: {} for name in engine.param_names}
        with torch.no_grad():
            for key, pieces in self._stored.items():
                for name, whole in zip(engine.param_names, self.shard.gather(pieces, like)):
                    full[name][key] = whole.view(engine.state.params[name].shape)
        return full


def _owned_moments(
    name: str, param: Tensor, start: int, stop: int, moments: dict[str, Tensor] | None, keys: Sequence[str]
) -> dict[str, Tensor]:
    """This rank's slice of a parameter's moments: kept, or cut from a checkpoint's whole ones."""
    if moments is None:
        raise CheckpointError(f"Parameter {name} not found in the source optimizer checkpoint states.")
    owned = {}
    for key in keys:
        moment = moments.get(key)
        if moment is None or moment.dtype != param.dtype or moment.numel() not in (param.numel(), stop - start):
            found = "nothing" if moment is None else f"{moment.dtype} of shape {tuple(moment.shape)}"
            raise CheckpointError(
                f"optimizer state {name!r}/{key!r}: expected {param.dtype} of shape "
                f"{tuple(param.shape)} (or this rank's slice of {stop - start}); "
                f"found {found}"
            )
        moment = moment.to(param.device)
        owned[key] = moment.reshape(-1)[start:stop].clone() if moment.numel() == param.numel() else moment
    return owned
