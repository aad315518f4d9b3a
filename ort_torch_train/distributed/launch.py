"""The default process group, initialised from a launcher's environment (torchrun's or mpirun's).

torchrun sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; mpirun sets ``OMPI_COMM_WORLD_RANK``/``_SIZE``/
``_LOCAL_RANK`` instead, read here without writing them back to the environment. Both need
``MASTER_ADDR``/``MASTER_PORT`` for env://'s rendezvous. The backend follows the device: NCCL for
CUDA, gloo otherwise. ``run_local_ranks`` starts a command as every rank of a group on this machine
(the benchmarks' launcher), killing and reaping them all on a failure or a timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def run_local_ranks(
    command: Sequence[str], world_size: int, timeout: float, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Run ``command`` as each rank of a ``world_size`` group on this machine (torchrun's variables, a
    free loopback port) and return each rank's standard output. Raises RuntimeError naming a rank that
    failed (with its standard error's end) or the ranks still running after ``timeout`` seconds; every
    rank's process group is killed and reaped before it returns or raises."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = dict(os.environ if environ is None else environ)
    with tempfile.TemporaryDirectory(prefix="ranks.") as folder:
        outputs = [Path(folder) / f"rank{rank}.out" for rank in range(world_size)]
        errors = [Path(folder) / f"rank{rank}.err" for rank in range(world_size)]
        procs: list[subprocess.Popen] = []
        try:
            for rank in range(world_size):
                ranks = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank)}
                rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
                with outputs[rank].open("w") as out, errors[rank].open("w") as err:
                    procs.append(
                        subprocess.Popen(
                            list(command),
                            env={**base, **ranks, **rendezvous},
                            stdout=out,
                            stderr=err,
                            start_new_session=True,  # the rank and its children: one process group to kill
                        )
                    )
            _wait_for_ranks(procs, errors, timeout)
            return [path.read_text() for path in outputs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_for_ranks(procs: Sequence[subprocess.Popen], errors: Sequence[Path], timeout: float) -> None:
    """Return once every rank exited 0; raise on the first failure or past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            tail = errors[failed[0]].read_text()[-4000:]
            raise RuntimeError(f"rank {failed[0]} exited with status {codes[failed[0]]}:\n{tail}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            running = [rank for rank, code in enumerate(codes) if code is None]
            raise RuntimeError(f"ranks {running} still running after {timeout:.0f} s: killed")
        time.sleep(0.05)
