"""Resuming a data loader that shuffles: a stateful loader's state (torchdata's ``StatefulDataLoader``,
or any loader with ``state_dict``/``load_state_dict``) kept in the checkpoint's properties, and a
warning for a shuffled loader that cannot continue where it stopped.

The state is stored as ``torch.save`` bytes in base64 and read back with ``weights_only=True``
(tensors, numbers, strings and containers only: a checkpoint cannot make the loader run code).
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader, SequentialSampler

from ort_torch_train.errors import CheckpointError

log = logging.getLogger(__name__)

LOADER_STATE_PROPERTY = "ort_torch_train.data_loader_state"


@runtime_checkable
class StatefulLoader(Protocol):
    """A loader that can say where it stands and continue from there (torchdata's StatefulDataLoader)."""

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: its sampler's order and the batches it has yielded."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration continue from ``state``."""
        ...


def store_loader_state(properties: Any, loader: StatefulLoader) -> None:
    """Write ``loader``'s state into a CheckpointState's ``properties``."""
    buffer = io.BytesIO()
    torch.save(loader.state_dict(), buffer)
    properties[LOADER_STATE_PROPERTY] = base64.b64encode(buffer.getvalue()).decode("ascii")


def restore_loader_state(properties: Any, loader: StatefulLoader) -> bool:
    """Load the state stored in ``properties`` into ``loader``; whether there was one."""
    if LOADER_STATE_PROPERTY not in properties:
        return False
    try:
        raw = base64.b64decode(str(properties[LOADER_STATE_PROPERTY]), validate=True)
        state = torch.load(io.BytesIO(raw), weights_only=True)
    except (binascii.Error, RuntimeError, ValueError, EOFError) as error:
        raise CheckpointError(
            f"checkpoint property {LOADER_STATE_PROPERTY!r} is not a data loader state ({error})"
        ) from error
    loader.load_state_dict(state)
    return True


def warn_if_order_is_lost(data: Any, start_step: int) -> None:
    """Warn when a resumed run replays a shuffling DataLoader that keeps no state: its order after the
    resume is a new draw, not the interrupted run's."""
    if not start_step or not isinstance(data, DataLoader) or isinstance(data, StatefulLoader):
        return
    batch_sampler = data.batch_sampler
    sampler = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else data.sampler
    if sampler is None or isinstance(sampler, SequentialSampler) or hasattr(sampler, "set_epoch"):
        return  # in order, or an order drawn from (seed, epoch) such as DistributedSampler's: replayable
    log.warning(
        "resuming at step %d with a DataLoader whose %s keeps no state: the batches from here on are a new "
        "shuffle, not the ones the interrupted run would have seen. For an exact resume, build the loader "
        "with ort_torch_train.trainer.array_loader, or use torchdata's StatefulDataLoader (its state is kept "
        "in the checkpoint)",
        start_step,
        type(sampler).__name__,
    )
