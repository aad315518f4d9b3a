"""``train`` under torchrun: the process group, the rank and world size, rank-0-only output.

A step's batch (``--batch-size`` rows, or one ready-made ``--batched`` batch) is the global batch:
rank r of W feeds its r-th of W equal slices (``trainer.data.array_loader``), so W ranks follow the
trajectory of one process on the whole batch. Rank 0 prints and writes the metrics; every rank
takes part in the checkpoint saves (collective). Under ``--pipeline-stages N`` the W = N ranks are a
pipeline's stages instead: every rank reads the whole batch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ort_torch_train.cli.common import CliError
from ort_torch_train.distributed.launch import LaunchEnvironment, init_default_group
from ort_torch_train.distributed.pipeline_plan import PipelineOptions


@dataclass(frozen=True)
class Launch:
    """Where this process stands in a torchrun launch (rank 0 of 1 outside one)."""

    rank: int = 0
    world_size: int = 1
    owns_group: bool = False  # this command initialised the process group (and destroys it at the end)
    device: str = "cpu"  # where this rank trains (NCCL reduces CUDA tensors only)

    @property
    def distributed(self) -> bool:
        """Whether gradients are averaged across several ranks."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this rank prints and writes the logs."""
        return self.rank == 0

    def close(self, finished: bool) -> None:
        """Destroy the process group this command initialised; after a finished run, once every rank is done
        (no rank leaves while a peer still waits on it)."""
        if not self.owns_group:
            return
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def launch_from_environment(device: str) -> tuple[Launch, str]:
    """The launch torchrun's environment describes (WORLD_SIZE > 1) and this rank's device.

    ``device`` "auto" is cuda:LOCAL_RANK when CUDA is available (NCCL), else cpu (gloo).
    """
    environment = LaunchEnvironment.read()
    world_size = environment.world_size or 1
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if world_size <= 1:
        return Launch(device=device), device
    if device == "cuda":
        device = f"cuda:{environment.local_rank or 0}"
    owns_group = not dist.is_initialized()
    if owns_group:
        if "MASTER_ADDR" in environment.missing_rendezvous:
            raise CliError(
                f"WORLD_SIZE is {world_size} but MASTER_ADDR is not set: launch with "
                "`torchrun --nproc_per_node=N -m ort_torch_train train ...`"
            )
        init_default_group(torch.device(device), environment.rank, world_size)
    return Launch(dist.get_rank(), dist.get_world_size(), owns_group, device), device


def pipeline_setting(args: argparse.Namespace, launch: Launch) -> PipelineOptions | None:
    """The ``--pipeline-*`` options as ``Module``'s ``pipeline`` (None without ``--pipeline-stages``);
    raises naming the option when they do not fit the launch."""
    if args.pipeline_stages is None:
        for option, value, default in (
            ("--micro-batches", args.micro_batches, 1),
            ("--pipeline-schedule", args.pipeline_schedule, "gpipe"),
            ("--pipeline-cuts", args.pipeline_cuts, ""),
        ):
            if value != default:
                raise CliError(f"{option} shapes a pipeline: give --pipeline-stages N too")
        return None
    if launch.world_size != args.pipeline_stages:
        raise CliError(
            f"--pipeline-stages {args.pipeline_stages} runs one stage per rank: launch {args.pipeline_stages} "
            f"processes with `torchrun --nproc_per_node={args.pipeline_stages} -m ort_torch_train train ...`, "
            f"got {launch.world_size}"
        )
    try:
        return PipelineOptions(args.pipeline_stages, args.micro_batches, args.pipeline_cuts, args.pipeline_schedule)
    except ValueError as error:
        raise CliError(str(error)) from error
