"""The C/C++ training API (``OrtTrainingApi``, ``Ort::TrainingSession``) as Python."""

from __future__ import annotations

import os

import torch

from ort_torch_train.api import CheckpointState

from .training_session import TrainingSession


def load_checkpoint(checkpoint_path: str | os.PathLike) -> CheckpointState:
    """``LoadCheckpoint``."""
    return CheckpointState.load_checkpoint(checkpoint_path)


def load_checkpoint_from_buffer(checkpoint_buffer: bytes | bytearray | memoryview) -> CheckpointState:
    """``LoadCheckpointFromBuffer``."""
    return CheckpointState.load_checkpoint(bytes(checkpoint_buffer))


def save_checkpoint(
    checkpoint_state: CheckpointState, checkpoint_path: str | os.PathLike, include_optimizer_state: bool = False
) -> None:
    """``SaveCheckpoint``."""
    CheckpointState.save_checkpoint(checkpoint_state, checkpoint_path, include_optimizer_state)


def set_seed(seed: int) -> None:
    """``SetSeed``: seeds the generators dropout draws from (CPU and every CUDA device)."""
    torch.manual_seed(seed)


LoadCheckpoint = load_checkpoint
LoadCheckpointFromBuffer = load_checkpoint_from_buffer
SaveCheckpoint = save_checkpoint
SetSeed = set_seed

__all__ = [
    "TrainingSession",
    "load_checkpoint",
    "load_checkpoint_from_buffer",
    "save_checkpoint",
    "set_seed",
]
