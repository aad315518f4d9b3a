"""Training data for the CLI: arrays from an .npz file matched to a model's user inputs, and batches.

Arrays are matched to the model's user inputs by name, or by ``--inputs key1,key2`` in the model's
input order. Axis 0 indexes samples; with ``batched`` the arrays are already cut into batches and
axis 0 indexes steps (``x[i]`` feeds step i), the layout of the reference corpora's ``data.npz``.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from ort_torch_train.cli.common import CliError, existing_file, shape_text, value_dtype, value_shape


@dataclass(frozen=True)
class InputSpec:
    """A user input as the model declares it."""

    name: str
    dtype: str
    shape: list[int | str | None] | None


def input_specs(model: onnx.ModelProto, names: list[str]) -> list[InputSpec]:
    """The declared dtype and shape of each named graph input."""
    values = {value.name: value for value in model.graph.input}
    return [InputSpec(name, value_dtype(values[name]), value_shape(values[name])) for name in names]


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz file (no pickled objects)."""
    path = existing_file(path, "data file")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise CliError(f"{str(path)!r} holds a single array; expected an .npz file (numpy.savez)")
        with data:
            return {key: data[key] for key in data.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise CliError(f"{str(path)!r} is not a readable .npz file ({error})") from error


def select_arrays(
    arrays: dict[str, np.ndarray], specs: list[InputSpec], keys: list[str] | None, source: str, option: str
) -> dict[str, np.ndarray]:
    """Input name -> array: by ``keys`` in input order, else by the inputs' own names."""
    names = [spec.name for spec in specs]
    if keys is None:
        missing = [name for name in names if name not in arrays]
        if missing:
            raise CliError(
                f"{source} has no array named {missing[0]!r}; the model's inputs are {', '.join(names)} "
                f"and the file holds {', '.join(arrays) or 'nothing'}: name them in order with "
                f"{option} KEY1,KEY2"
            )
        return {name: arrays[name] for name in names}
    if len(keys) != len(names):
        raise CliError(f"{option} names {len(keys)} arrays but the model has {len(names)} inputs ({', '.join(names)})")
    unknown = [key for key in keys if key not in arrays]
    if unknown:
        raise CliError(f"{source} has no array {unknown[0]!r} (it holds {', '.join(arrays)})")
    return {name: arrays[key] for name, key in zip(names, keys)}


def check_arrays(arrays: dict[str, np.ndarray], specs: list[InputSpec], source: str, batched: bool = False) -> int:
    """Check dtypes and shapes against the declarations; return the common length of axis 0."""
    lengths = {}
    for spec in specs:
        array = arrays[spec.name]
        label = f"{source} array for input {spec.name!r}"
        if array.dtype.name != spec.dtype:
            raise CliError(
                f"{label} is {array.dtype.name}, the model expects {spec.dtype} "
                f"(convert it with .astype(np.{spec.dtype}))"
            )
        if array.ndim == 0:
            raise CliError(f"{label} is a scalar; expected one row per {'batch' if batched else 'sample'}")
        if spec.shape is not None:
            _check_shape(label, array.shape, spec, spec.shape, batched)
        lengths[spec.name] = array.shape[0]
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} {length}" for name, length in lengths.items())
        raise CliError(f"{source}: the arrays differ in length along axis 0 ({listed})")
    return next(iter(lengths.values()), 0)


def check_batch_size(specs: list[InputSpec], batch_size: int) -> None:
    """Refuse a batch size that an input with a fixed batch dimension cannot take."""
    for spec in specs:
        if spec.shape and isinstance(spec.shape[0], int) and spec.shape[0] != batch_size:
            raise CliError(
                f"input {spec.name!r} is {shape_text(spec.shape)}: its batch size is fixed, "
                f"use --batch-size {spec.shape[0]}"
            )


def _check_shape(
    label: str, shape: tuple[int, ...], spec: InputSpec, declared_shape: list[int | str | None], batched: bool
) -> None:
    """``shape`` fits ``spec``'s ``declared_shape``."""
    fed = shape[1:] if batched else (None, *shape[1:])  # one step's input; None: the batch size, chosen later
    if len(fed) != len(declared_shape):
        layout = "[steps, batch, ...]" if batched else "[samples, ...]"
        looks_batched = not batched and len(fed) == len(declared_shape) + 1
        hint = " (arrays already cut into batches need --batched)" if looks_batched else ""
        raise CliError(
            f"{label} has shape {list(shape)}, but input {spec.name!r} is {shape_text(declared_shape)}: "
            f"expected {len(declared_shape) + (1 if batched else 0)} dimensions laid out {layout}{hint}"
        )
    for axis, (got, declared) in enumerate(zip(fed, declared_shape)):
        if got is not None and isinstance(declared, int) and got != declared:
            raise CliError(
                f"{label} has shape {list(shape)}, but input {spec.name!r} is {shape_text(declared_shape)}: "
                f"dimension {axis + batched} is {got}, expected {declared}"
            )


class Batches:
    """The batch of each global step: epochs of (optionally shuffled) batches, dropping a last partial one.

    The order depends only on the seed and the step, so a resumed run sees the batches an
    uninterrupted run would have seen.
    """

    def __init__(self, arrays: dict[str, np.ndarray], batch_size: int, batched: bool, shuffle: bool, seed: int) -> None:
        self.tensors = [torch.from_numpy(np.ascontiguousarray(array)) for array in arrays.values()]
        self.units = self.tensors[0].shape[0]  # samples, or batches when already batched
        self.batch_size = 1 if batched else batch_size
        self.steps_per_epoch = self.units // self.batch_size
        if self.steps_per_epoch == 0:
            what = "no batches" if batched else f"{self.units} samples, fewer than the batch size {batch_size}"
            raise CliError(f"the training data holds {what}")
        self.batched = batched
        self.shuffle = shuffle
        self.seed = seed
        self._order: tuple[int, torch.Tensor] | None = None

    def __getitem__(self, step: int) -> list[torch.Tensor]:
        epoch, position = divmod(step, self.steps_per_epoch)
        order = self._epoch_order(epoch)
        if self.batched:
            return [tensor[order[position]] for tensor in self.tensors]
        rows = order[position * self.batch_size : (position + 1) * self.batch_size]
        return [tensor[rows] for tensor in self.tensors]

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.units)
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(self.units, generator=generator))
        return self._order[1]


def split_keys(text: str | None) -> list[str] | None:
    """``"x,y"`` -> ``["x", "y"]``; None stays None."""
    if text is None:
        return None
    keys = [key.strip() for key in text.split(",")]
    if not all(keys):
        raise CliError(f"empty array name in {text!r}: expected KEY1,KEY2,...")
    return keys
