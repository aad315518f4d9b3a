"""Batches for the training loop: in-memory arrays as a torch Dataset, read through a DataLoader whose
batch order depends only on (seed, epoch) and which can start mid-epoch, so a resumed run sees the
batches an uninterrupted run would have seen.

``data_position`` and ``restore_data_position`` store and read that position (seed, epoch, batches
consumed) in a checkpoint's properties.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ort_torch_train.errors import CheckpointError

SEED_PROPERTY = "ort_torch_train.data_seed"
EPOCH_PROPERTY = "ort_torch_train.data_epoch"
POSITION_PROPERTY = "ort_torch_train.data_position"


class ArrayDataset(Dataset):
    """Rows of equally long arrays (one per model input); ``batched``: axis 0 indexes ready-made batches,
    of which rank ``rank`` of ``world_size`` takes its equal slice of rows.

    ``dataset[i]`` is row i as a list of tensors; a DataLoader fetches whole batches at once
    (``__getitems__``), one indexing per array.
    """

    def __init__(self, arrays: Sequence[np.ndarray], batched: bool = False, rank: int = 0, world_size: int = 1) -> None:
        contiguous = [np.ascontiguousarray(array) for array in arrays]
        self.tensors = [torch.from_numpy(a if a.flags.writeable else a.copy()) for a in contiguous]
        self.batched = batched
        self.rank = rank
        self.world_size = world_size
        if batched and self.tensors and self.tensors[0].ndim > 1:
            check_even_split(int(self.tensors[0].shape[1]), world_size)

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0]) if self.tensors else 0

    def __getitem__(self, index: int) -> list[torch.Tensor]:
        return [tensor[index] for tensor in self.tensors]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        if self.batched:  # one unit is a whole batch
            batch = [tensor[indices[0]] for tensor in self.tensors]
            share = batch[0].shape[0] // self.world_size
            return [tensor[self.rank * share : (self.rank + 1) * share] for tensor in batch]
        rows = torch.as_tensor(indices, dtype=torch.long)
        return [tensor[rows] for tensor in self.tensors]


def keep_batch(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    """The DataLoader's collate function: ``ArrayDataset.__getitems__`` already returns the batch."""
    return batch


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of row indices: epoch ``e`` is ``randperm(units)`` seeded by (seed, e) (or 0..units-1
    without shuffling), cut into ``batch_size`` rows, a last partial batch dropped.

    Iterating starts at ``(epoch, position)`` (``set_position``); the loop moves on to the next epoch
    with ``set_position(epoch + 1, 0)``. Under data parallelism each of ``world_size`` ranks takes its
    equal slice of every batch, so the ranks together follow one process's trajectory.

    Args:
        units: rows (or ready-made batches) to draw from.
        batch_size: rows per batch.
        shuffle: a seeded permutation per epoch (False: in order).
        seed: the permutations' seed.
        rank: this process's rank under data parallelism.
        world_size: the number of ranks sharing each batch.
    """

    def __init__(
        self, units: int, batch_size: int, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        check_even_split(batch_size, world_size)
        self.units = units
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return self.units // self.batch_size

    def set_position(self, epoch: int, position: int) -> None:
        """Make the next iteration start at batch ``position`` of epoch ``epoch``."""
        self.epoch = epoch
        self.position = position

    def order(self, epoch: int) -> torch.Tensor:
        """The row order of ``epoch``."""
        if not self.shuffle:
            return torch.arange(self.units)
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
        return torch.randperm(self.units, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch)
        share = self.batch_size // self.world_size
        for batch in range(self.position, len(self)):
            begin = batch * self.batch_size + self.rank * share
            yield order[begin : begin + share].tolist()


def check_even_split(batch_size: int, world_size: int) -> None:
    """Refuse a batch that does not split into equal slices over the ranks."""
    if batch_size % world_size:
        raise ValueError(
            f"batch_size: a batch of {batch_size} rows does not split evenly over {world_size} ranks; "
            "use a batch size that is a multiple of the number of processes"
        )


def array_loader(
    arrays: Sequence[np.ndarray],
    batch_size: int,
    *,
    batched: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    workers: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """A DataLoader over ``arrays`` with a ``ResumableBatchSampler`` (``batched``: one ready batch per step).

    Its own generator seeds the workers, so iterating never draws from torch's global RNG (dropout's).
    """
    if batched:  # the dataset slices each ready-made batch for this rank
        dataset = ArrayDataset(arrays, True, rank, world_size)
        sampler = ResumableBatchSampler(len(dataset), 1, shuffle, seed)
    else:
        dataset = ArrayDataset(arrays)
        sampler = ResumableBatchSampler(len(dataset), batch_size, shuffle, seed, rank, world_size)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=keep_batch,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed % 2**63),
    )


@dataclass(frozen=True)
class DataPosition:
    """Where the loop stands in its data: the epoch and the batches consumed in it, and the order's seed."""

    epoch: int = 0
    position: int = 0
    seed: int | None = None


def resumable_sampler(data: Any) -> ResumableBatchSampler | None:
    """The ResumableBatchSampler behind ``data`` (a DataLoader built on one, or the sampler), else None."""
    if isinstance(data, ResumableBatchSampler):
        return data
    sampler = getattr(data, "batch_sampler", None)
    return sampler if isinstance(sampler, ResumableBatchSampler) else None


def data_position(properties: Any, batches: int | None = None) -> DataPosition | None:
    """The position stored in a CheckpointState's ``properties``, or None when it holds none; a
    CheckpointError names a property that is no integer >= 0 (the position at most ``batches``, the
    epoch's batch count when known: a save after an epoch's last batch stores ``batches``)."""
    if EPOCH_PROPERTY not in properties or POSITION_PROPERTY not in properties:
        return None
    epoch = _integer_property(properties, EPOCH_PROPERTY, "an integer >= 0")
    position = _integer_property(properties, POSITION_PROPERTY, f"an integer in [0, {batches}]" if batches else "")
    if batches is not None and position > batches:
        raise CheckpointError(
            f"checkpoint property {POSITION_PROPERTY!r} is {position}: expected an integer in [0, {batches}] "
            f"(the batches of one epoch of this data)"
        )
    seed = _integer_property(properties, SEED_PROPERTY, "an integer") if SEED_PROPERTY in properties else None
    return DataPosition(epoch, position, seed)


def _integer_property(properties: Any, name: str, expected: str) -> int:
    """An integer property (>= 0 unless ``expected`` is just "an integer"), or a CheckpointError naming it."""
    value = properties[name]
    expected = expected or "an integer >= 0"
    integral = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value, integral = int(value), True
    if not integral or (expected != "an integer" and value < 0):
        raise CheckpointError(f"checkpoint property {name!r} is {value!r}: expected {expected}")
    return int(value)


def store_data_position(properties: Any, position: DataPosition) -> None:
    """Write ``position`` into a CheckpointState's ``properties``."""
    properties[EPOCH_PROPERTY] = position.epoch
    properties[POSITION_PROPERTY] = position.position
    if position.seed is not None:
        properties[SEED_PROPERTY] = position.seed
