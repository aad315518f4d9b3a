"""ZeRO stage 1: the optimizer state sharded across the ranks of a data-parallel process group.

Each trainable parameter has one owner rank (parameters dealt out by size, largest first, to the
least loaded rank, as torch's ZeroRedundancyOptimizer does). A rank keeps the moments of the
parameters it owns only and updates them with the ORT-exact kernels of ``OptimizerEngine``; then
each updated parameter is broadcast from its owner. The gradients are already averaged, so
clipping sees the same global norm on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ort_torch_train.checkpoint.state import TrainingState
from ort_torch_train.errors import DistributedError
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.optimizer_model import OptimizerSpec


def deal_owners(names: Sequence[str], sizes: dict[str, int], world_size: int) -> dict[str, int]:
    """The owner rank of each parameter: largest first, each to the least loaded rank (ties: lowest rank)."""
    load = [0] * world_size
    owners = {}
    for name in sorted(names, key=lambda n: (-sizes[n], list(names).index(n))):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners[name] = rank
        load[rank] += sizes[name]
    return owners


class ShardedOptimizerEngine:
    """An ``OptimizerEngine`` over all trainable parameters whose state and update are sharded across ``group``."""

    fuses_into_step = False  # a compiled train step runs forward, backward and reduction; the update runs here
    last_step_skipped = False  # no fp16 loss scaling on sharded state (api.Optimizer refuses it)
    skipped_steps = 0

    def __init__(self, spec: OptimizerSpec, state: TrainingState, param_names: Sequence[str], group: Any, *,
                 implementation: str | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.spec = spec
        self.state = state
        self.param_names = tuple(param_names)
        self.owners = deal_owners(self.param_names, {n: state.params[n].numel() for n in self.param_names},
                                  self.world_size)
        owned = [name for name in self.param_names if self.owners[name] == self.rank]
        if not owned:
            raise DistributedError(f"Optimizer(shard_state=True): rank {self.rank} of {self.world_size} owns no "
                                   f"parameter: the model has {len(self.param_names)} trainable parameters; "
                                   "use fewer ranks or shard_state=False")
        if state.optimizer is not None:  # a checkpoint's moments: keep this rank's shard only
            for name in [n for n in state.optimizer.momentums if n not in owned]:
                del state.optimizer.momentums[name]
        self.local = OptimizerEngine(dataclasses.replace(spec, clip_max_norm=None), state, owned,
                                     implementation=implementation)
        self._sources = {name: dist.get_global_rank(group, owner) if group is not dist.group.WORLD else owner
                         for name, owner in self.owners.items()}

    def step(self, update_signal: bool = True) -> bool:
        """Clip all gradients (if the model does), update this rank's shard, broadcast the updated parameters."""
        if self.spec.clip_max_norm is not None:
            clip_grad_norm_([self.state.params[n].grad for n in self.param_names], self.spec.clip_max_norm)
        if not self.local.step(update_signal):
            return False
        with torch.no_grad():
            works = [dist.broadcast(self.state.params[name].detach(), src=self._sources[name], group=self.group,
                                    async_op=True) for name in self.param_names]
        for work in works:
            work.wait()
        return True

    def gathered_momentums(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every parameter's moments, broadcast from their owners (a collective: all ranks call it)."""
        mine = self.state.optimizer.momentums
        full = {}
        with torch.no_grad():
            for name in self.param_names:
                param = self.state.params[name]
                full[name] = {key: mine[name][key] if name in mine else torch.empty_like(param.detach())
                              for key in self.spec.momentum_names}
                for key in self.spec.momentum_names:
                    dist.broadcast(full[name][key], src=self._sources[name], group=self.group)
        return full

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """All trainable parameters, in the training graph's order."""
        return [self.state.params[name] for name in self.param_names]

    def refresh(self) -> None:
        """(Re)build the shard's tensor lists."""
        self.local.refresh()

    def __getattr__(self, name: str) -> Any:  # learning rate and step counters: the shard's engine
        if name == "local":
            raise AttributeError(name)
        return getattr(self.local, name)
