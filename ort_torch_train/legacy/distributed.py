"""The legacy session's distributed settings on torch.distributed.

``world_rank``/``world_size``/``data_parallel_size`` select data parallelism over the default
process group, initialised here when the launcher has not done it: env:// from torchrun, or
mpirun's ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (with MASTER_ADDR/MASTER_PORT set).
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from ort_torch_train.distributed.data_parallel import DataParallel, data_parallel
from ort_torch_train.errors import DistributedError


def legacy_data_parallel(parameters: Any, engine: Any) -> DataParallel | None:
    """Data parallelism for a legacy session's engine, or None for a single process."""
    world_size, world_rank = parameters.world_size, parameters.world_rank
    if world_size == 1 and parameters.data_parallel_size == 1:
        return None
    if parameters.data_parallel_size != world_size:
        raise NotImplementedError(
            f"TrainingParameters.data_parallel_size = {parameters.data_parallel_size} with "
            f"world_size = {world_size}: only pure data parallelism "
            "(data_parallel_size == world_size) is implemented"
        )
    if not dist.is_initialized():
        _init_from_environment(world_rank, world_size)
    if (dist.get_rank(), dist.get_world_size()) != (world_rank, world_size):
        raise DistributedError(
            f"TrainingParameters.world_rank/world_size = {world_rank}/{world_size}, but the "
            f"process group has this process as rank {dist.get_rank()} of "
            f"{dist.get_world_size()}"
        )
    return data_parallel(engine, None)


def _init_from_environment(world_rank: int, world_size: int) -> None:
    """init_process_group over env:// (torchrun's or mpirun's variables)."""
    environ = os.environ
    for name, mpi_name in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")):
        if name not in environ and mpi_name in environ:
            environ[name] = environ[mpi_name]
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in environ]
    if missing:
        raise DistributedError(
            f"TrainingParameters.world_size = {world_size}: no process group is initialised "
            f"and the environment lacks {missing} (launch with torchrun, or set them for mpirun)"
        )
    dist.init_process_group(backend="nccl" if _on_cuda() else "gloo", rank=world_rank, world_size=world_size)


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available() and "LOCAL_RANK" in os.environ
