"""The default process group, initialised from a launcher's environment (torchrun's or mpirun's).

torchrun sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; mpirun sets ``OMPI_COMM_WORLD_RANK``/``_SIZE``/
``_LOCAL_RANK`` instead, read here without writing them back to the environment. Both need
``MASTER_ADDR``/``MASTER_PORT`` for env://'s rendezvous. The backend follows the device: NCCL for
CUDA, gloo otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")
_MPIRUN_NAMES = {
    "RANK": "OMPI_COMM_WORLD_RANK",
    "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
    "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
}


@dataclass(frozen=True)
class LaunchEnvironment:
    """What a launcher's environment says of this process (None where it says nothing)."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    missing_rendezvous: tuple[str, ...]  # the RENDEZVOUS_VARIABLES not set

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> LaunchEnvironment:
        """The launch ``environ`` describes (torchrun's variables first, then mpirun's)."""
        numbers = {name: environ.get(name, environ.get(mpirun_name)) for name, mpirun_name in _MPIRUN_NAMES.items()}
        rank, world_size, local_rank = (None if value is None else int(value) for value in numbers.values())
        return cls(rank, world_size, local_rank, tuple(name for name in RENDEZVOUS_VARIABLES if name not in environ))


def backend_for(device: torch.device) -> str:
    """The collective backend for tensors on ``device``: "nccl" for CUDA, "gloo" otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_default_group(device: torch.device, rank: int | None, world_size: int | None) -> None:
    """Initialise the default process group over env:// for a process training on ``device``
    (made the current CUDA device first), as rank ``rank`` of ``world_size`` (None: env://'s
    ``RANK``/``WORLD_SIZE``)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend_for(device),
        init_method="env://",
        rank=-1 if rank is None else rank,
        world_size=-1 if world_size is None else world_size,
    )
