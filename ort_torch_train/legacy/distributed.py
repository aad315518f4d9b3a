"""The legacy session's distributed settings on torch.distributed.

``world_rank``/``world_size``/``data_parallel_size`` select data parallelism over the default
process group, initialised here when the launcher has not done it: env:// from torchrun, or
mpirun's ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (with MASTER_ADDR/MASTER_PORT set).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ort_torch_train.distributed.launch import LaunchEnvironment, init_default_group
from ort_torch_train.errors import DistributedError
from ort_torch_train.legacy.parameters import TrainingParameters


def legacy_distributed(parameters: TrainingParameters, device: torch.device) -> bool:
    """Whether a legacy session trains data-parallel on the default process group (initialised here
    for a process training on ``device`` when needed, also for tensor parallel alone); False for a
    single process or ``horizontal_parallel_size`` ranks sharing one replica."""
    world_size = parameters.world_size
    horizontal = parameters.horizontal_parallel_size
    if world_size == 1 and parameters.data_parallel_size == 1 and horizontal == 1:
        return False
    if parameters.data_parallel_size * horizontal != world_size:
        raise NotImplementedError(
            f"TrainingParameters.data_parallel_size = {parameters.data_parallel_size} and "
            f"horizontal_parallel_size = {horizontal} with world_size = {world_size}: expected "
            "data_parallel_size * horizontal_parallel_size == world_size"
        )
    join_default_group(parameters, device, f"TrainingParameters.world_size = {world_size}")
    return parameters.data_parallel_size > 1


def join_default_group(parameters: TrainingParameters, device: torch.device, setting: str) -> None:
    """Initialise the default process group as rank ``world_rank`` of ``world_size`` for a process training on
    ``device`` unless one is, then check this process holds that rank; ``setting`` names what asked for it."""
    world_size, world_rank = parameters.world_size, parameters.world_rank
    if not dist.is_initialized():
        missing = LaunchEnvironment.read().missing_rendezvous
        if missing:
            raise DistributedError(
                f"{setting}: no process group is initialised and the environment lacks {list(missing)} "
                "(launch with torchrun, or set them for mpirun)"
            )
        init_default_group(device, world_rank, world_size)
    if (dist.get_rank(), dist.get_world_size()) != (world_rank, world_size):
        raise DistributedError(
            f"TrainingParameters.world_rank/world_size = {world_rank}/{world_size}, but the "
            f"process group has this process as rank {dist.get_rank()} of "
            f"{dist.get_world_size()}"
        )
