"""Data-parallel training on torch.distributed: gradients averaged across the ranks of a process group.

Eager steps run the forward through ``DistributedDataParallel`` over the training graph, so DDP's
reducer all-reduces the gradients in buckets while the backward runs. Compiled steps all-reduce
the gradients inside the compiled graph with traceable functional collectives. Inside
``no_sync()`` steps accumulate locally; the next step outside it reduces the accumulated gradients.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import hashlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ort_torch_train.checkpoint.tensor_bytes import tensor_to_bytes
from ort_torch_train.distributed.adasum import adasum_hook, check_world_size
from ort_torch_train.distributed.checkpoint import DistributedCheckpoint
from ort_torch_train.errors import DistributedError
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.torch_internals import functional_collectives

_LIVE: weakref.WeakSet[DataParallel] = weakref.WeakSet()


@atexit.register
def _release_reducers() -> None:
    """Free the DDP reducers before interpreter finalisation: one freed during it can abort the
    process in gloo ("terminate called without an active exception", seen with torch 2.13)."""
    for data_parallel in list(_LIVE):
        data_parallel.release()
    gc.collect()


def require_process_group(process_group: Any, what: str) -> Any:
    """The process group to use (the default one when ``process_group`` is None); raises without one."""
    if not dist.is_available():
        raise DistributedError(f"{what}: torch.distributed is not available in this torch build")
    if not dist.is_initialized():
        raise DistributedError(
            f"{what}: expected an initialised process group (torch.distributed."
            "init_process_group, e.g. under torchrun); none is initialised"
        )
    return process_group if process_group is not None else dist.group.WORLD


class DataParallel:
    """Averages a training engine's gradients across the ranks of ``group`` (see the module doc), or
    combines them by Adasum (``gradient_combination="adasum"``: ``distributed/adasum.py``)."""

    shards_parameters = False  # every rank holds whole parameters (FSDP2's ``fully_sharded.py`` does not)

    def __init__(
        self,
        graph: Any,
        names: Sequence[str],
        params: Sequence[nn.Parameter],
        group: Any,
        gradient_combination: str = "average",
    ) -> None:
        self.group = group
        self.gradient_combination = gradient_combination
        self.checkpoint = DistributedCheckpoint(group)  # how the state's checkpoints are saved
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.synchronise = True
        if gradient_combination == "adasum":
            check_world_size(self.world_size, self.rank)  # every rank raises, before any collective
        require_identical(dict(zip(names, params)), group, "parameters")
        self._ddp: DistributedDataParallel | None = DistributedDataParallel(
            _TrainGraph(graph, params), process_group=group, init_sync=False
        )
        if gradient_combination == "adasum":
            self._ddp.register_comm_hook(group, adasum_hook)
        _LIVE.add(self)

    def forward(self, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The training graph's outputs; their backward all-reduces the gradients unless in ``no_sync``."""
        ddp = self._ddp
        if ddp is None:
            raise DistributedError("data-parallel step after the process's exit began (the reducer is released)")
        ddp.require_backward_grad_sync = self.synchronise
        return ddp(list(inputs))

    @property
    def shard_group(self) -> Any:
        """The ranks whose shards together make each sharded parameter (where ``shards_parameters``)."""
        return self.group

    @property
    def data_parallel_size(self) -> int:
        """How many replicas average their gradients."""
        return self.world_size

    def release(self) -> None:
        """Free the DDP reducer (at exit: no step runs after it)."""
        self._ddp = None

    def compiled_reduction(self) -> GradientAverage | None:
        """The reduction a compiled step runs on its accumulated gradients (None inside ``no_sync``)."""
        return GradientAverage(self.group, self.world_size) if self.synchronise else None

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Steps inside accumulate gradients locally; the next step outside reduces them."""
        previous, self.synchronise = self.synchronise, False
        try:
            yield
        finally:
            self.synchronise = previous

    @contextlib.contextmanager
    def collective_errors(self, action: str) -> Iterator[None]:
        """Turn a failed or timed-out collective into a DistributedError naming this rank."""
        try:
            yield
        except DistributedError:
            raise
        except RuntimeError as error:
            text = str(error)
            if any(
                word in text
                for word in ("gloo", "Gloo", "NCCL", "nccl", "timed out", "Timed out", "Connection", "closed", "peer")
            ):
                raise DistributedError(
                    f"{action} on rank {self.rank} of {self.world_size}: a collective "
                    f"failed (a rank died, timed out or diverged): {text}"
                ) from error
            raise


@dataclasses.dataclass(frozen=True, eq=False)
class GradientAverage:
    """Averages gradients across a process group inside a compiled graph (one coalesced all-reduce).

    Frozen: fixed for a compiled step's life, so a precompiled step keeps no guards on it; its repr,
    naming the group and the world size, is part of a saved step's key (``precompiled.step_key``)."""

    group: Any
    world_size: int

    def __call__(self, grads: list[Tensor]) -> list[Tensor]:
        summed = functional_collectives.all_reduce_coalesced(grads, "sum", self.group)
        return torch._foreach_div(summed, float(self.world_size))  # type: ignore[return-value]  # a list at run time

    def __hash__(self) -> int:
        return hash((GradientAverage, id(self.group), self.world_size))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GradientAverage) and other.group is self.group and other.world_size == self.world_size

    def __repr__(self) -> str:
        return f"GradientAverage(group={self.group.group_name!r}, world_size={self.world_size})"


class _TrainGraph(nn.Module):
    """The training graph over the engine's own parameters (the same Parameter objects), for DDP."""

    def __init__(self, graph: Any, params: Sequence[nn.Parameter]) -> None:
        super().__init__()
        self.params = nn.ParameterList(params)
        self._graph = [graph]  # a list: keeps the graph out of the module tree

    def forward(self, inputs: list[Tensor]) -> tuple[Tensor, ...]:
        return tuple(self._graph[0](inputs, list(self.params)))


def require_identical(
    tensors: dict[Any, Tensor], group: Any, what: str, advice: str = "every rank must load the same checkpoint"
) -> None:
    """Raise on every rank when the ranks' ``tensors`` differ (compared bitwise with rank 0's)."""
    rank0 = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
    mismatched = []
    with torch.no_grad():
        for key, tensor in tensors.items():
            reference = tensor.detach().clone()
            dist.broadcast(reference, src=rank0, group=group)
            if not torch.equal(reference, tensor.detach()):
                mismatched.append(key)
    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")  # NCCL: CUDA tensors
    flag = torch.tensor([1.0 if mismatched else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if flag.item():
        rank = dist.get_rank(group)
        detail = f"this rank's {what} {mismatched[:3]} differ" if mismatched else f"this rank's {what} match"
        raise DistributedError(f"ranks start from different {what}: {advice} (rank {rank}: {detail} from rank 0's)")


def _digest(parts: Sequence[Any], device: torch.device) -> Tensor:
    """A 32-byte digest of ``parts`` (tensors by dtype, shape and bytes; anything else by repr)."""
    digest = hashlib.blake2b(digest_size=32)
    for part in parts:
        if isinstance(part, Tensor):
            digest.update(f"{part.dtype}{tuple(part.shape)}".encode())
            digest.update(tensor_to_bytes(part))
        else:
            digest.update(repr(part).encode())
    return torch.frombuffer(bytearray(digest.digest()), dtype=torch.uint8).to(device)


def require_same_optimizer_state(state: TrainingState, settings: object, group: Any) -> None:
    """Raise on every rank when the ranks' optimizer ``settings`` (the optimizer model's hyperparameters)
    or the state's step, initial learning rate or moments differ: a collective, at an Optimizer's start."""
    optimizer = state.optimizer
    moments: list[
        tuple[str, str, Tensor]
    ] = []  # whole moments only: a sharded optimizer's slices differ from rank to rank by design
    for name, named in ({} if optimizer is None else optimizer.momentums).items():
        moments += [(name, key, named[key]) for key in sorted(named) if named[key].shape == state.params[name].shape]
    moments.sort(key=lambda entry: entry[:2])
    fingerprints: dict[str, list[Any]] = {
        "hyperparameters": [settings],
        "step": [None if optimizer is None else optimizer.step],
        "initial learning rate": [None if optimizer is None else optimizer.initial_learning_rate],
        "moments": [part for entry in moments for part in entry],
    }
    require_identical(
        {key: _digest(parts, state.device) for key, parts in fingerprints.items()},
        group,
        "optimizer state",
        "every rank must load the same checkpoint and optimizer model",
    )


def require_same_learning_rate(learning_rate: float, group: Any, device: torch.device) -> None:
    """Raise on every rank when the ranks' learning rates differ (a collective, at the first step)."""
    require_identical(
        {"learning rate": _digest([learning_rate], device)},
        group,
        "learning rates",
        "every rank must set the same learning rate and schedule",
    )


def data_parallel(
    graph: Any, state: TrainingState, names: Sequence[str], group: Any, gradient_combination: str = "average"
) -> DataParallel:
    """Data parallelism for a training graph over ``state``'s parameters ``names``, whose ranks all hold
    the same values, combining gradients by ``gradient_combination`` ("average" or "adasum"); from now
    on the state's checkpoints are written once, by rank 0."""
    state.require_loaded("perform distributed training")
    parallel = DataParallel(graph, names, [state.params[name] for name in names], group, gradient_combination)
    state.coordinate_saves(parallel.checkpoint)
    return parallel
