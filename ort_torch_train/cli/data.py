"""Training data for the CLI: arrays from an .npz file, or columns of a Parquet/Arrow/CSV/JSONL file,
matched to a model's user inputs and checked against their declarations.

Arrays are matched to the model's user inputs by name, by ``--inputs key1,key2`` in the model's
input order, or by ``--inputs input=key,...``; in a table, ``input=col1,col2,...`` and patterns
(``input=px*``) stack columns on a last axis. Axis 0 indexes samples; with ``batched`` the arrays
are already cut into batches and axis 0 indexes steps (``x[i]`` feeds step i), the layout of the
reference corpora's ``data.npz``. Batches are read by ``trainer.data.array_loader``.
"""

from __future__ import annotations

import fnmatch
import logging
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ort_torch_train.cli.common import CliError, existing_file, shape_text, value_dtype, value_shape
from ort_torch_train.trainer.casting import checked_cast
from ort_torch_train.trainer.table_stream import TableColumns
from ort_torch_train.trainer.tables import TABLE_FORMATS, table_format

log = logging.getLogger(__name__)


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


def load_data(path: str | Path) -> tuple[Mapping[str, np.ndarray], bool]:
    """The arrays of an .npz file, or the columns of a Parquet/Arrow/CSV/JSONL file (each read, streamed, when
    used); and whether it is a table (whose columns are cast to the model's dtypes)."""
    kind = table_format(path)
    if kind is None:
        if Path(path).suffix.lower() not in (".npz", ""):  # no suffix: read as .npz, as numpy.load would
            known = ", ".join([".npz", *sorted(TABLE_FORMATS)])
            raise CliError(f"{str(path)!r}: unknown data format {Path(path).suffix!r}; expected {known}")
        return load_npz(path), False
    existing_file(path, "data file")
    return TableColumns(path, kind), True


def select_arrays(
    arrays: Mapping[str, np.ndarray],
    specs: list[InputSpec],
    keys: str | None,
    source: str,
    option: str,
    table: bool = False,
) -> dict[str, np.ndarray]:
    """Input name -> array: by ``keys`` (``KEY1,KEY2`` in input order, or ``input=KEY,...`` by name, where a
    table's KEY may be a pattern such as ``px*`` whose columns are stacked), else by the inputs' own names.
    A table's columns are cast to the inputs' dtypes and reshaped to their declared dimensions."""
    names = [spec.name for spec in specs]
    what = "column" if table else "array"
    if keys is None:
        missing = [name for name in names if name not in arrays]
        if missing:
            example = f"{names[0]}=COL1,COL2,...,{names[-1]}=COL" if table and len(names) > 1 else "KEY1,KEY2"
            raise CliError(
                f"{source} has no {what} named {missing[0]!r}; the model's inputs are {', '.join(names)} "
                f"and the file holds {', '.join(arrays) or 'nothing'}: name them in order with "
                f"{option} KEY1,KEY2" + (f", or list a table's columns per input: {option} {example}" if table else "")
            )
        mapping = {name: name for name in names}
    else:
        mapping = input_mapping(keys, names, option)
    named = {part for key in mapping.values() for part in key.split(",") if part in arrays}  # no pattern takes these
    picked = {spec.name: _columns(arrays, mapping[spec.name], named, source, what) for spec in specs}
    if isinstance(arrays, TableColumns):
        arrays.load([name for columns in picked.values() for name in columns])  # in one pass over the file
    selected = {}
    for spec in specs:
        key, columns = mapping[spec.name], picked[spec.name]
        array = arrays[columns[0]] if len(columns) == 1 else np.stack([arrays[name] for name in columns], axis=-1)
        label = f"{source} {what} {key!r}"
        if columns != [key]:
            label = f"{source} {what}s {', '.join(columns)} (from {key!r})"
            log.info("input %r: %s", spec.name, label)
        array = _as_input(array, spec, label) if table else array
        selected[spec.name] = _column_as_matrix(array, spec)
        if columns != [key]:
            check_arrays({spec.name: selected[spec.name]}, [spec], label)
    return selected


def input_mapping(text: str, names: list[str], option: str) -> dict[str, str]:
    """``KEY1,KEY2`` (one per input, in order) or ``input=KEY,...`` (unnamed inputs keep their names);
    there a key without ``=`` adds a column to the input before it (``features=a,b,c,target=y``), and
    the input's key becomes the list ``a,b,c``."""
    keys = split_keys(text)
    assert keys is not None, "split_keys keeps a text"
    if any("=" in key for key in keys) and "=" not in keys[0]:
        raise CliError(f"{option}: {keys[0]!r} is not INPUT=KEY with INPUT one of {', '.join(names)}")
    if any("=" in key for key in keys):
        joined: list[str] = []
        for key in keys:
            if "=" in key:
                joined.append(key)
            else:
                joined[-1] += f",{key}"
        keys = joined
    if not any("=" in key for key in keys):
        if len(keys) != len(names):
            raise CliError(
                f"{option} names {len(keys)} arrays but the model has {len(names)} inputs ({', '.join(names)})"
            )
        return dict(zip(names, keys))
    mapping = {name: name for name in names}
    for key in keys:
        name, equals, source_key = (part.strip() for part in key.partition("="))
        if not equals or name not in names or not source_key:
            raise CliError(f"{option}: {key!r} is not INPUT=KEY with INPUT one of {', '.join(names)}")
        mapping[name] = source_key
    return mapping


def _columns(arrays: Mapping[str, np.ndarray], key: str, named: set[str], source: str, what: str) -> list[str]:
    """The arrays ``key`` names: itself, a list ``a,b,c``, or the matches of a pattern such as ``px*``
    (in file order, leaving out those another input names)."""
    if key in arrays:
        return [key]
    columns: list[str] = []
    for part in key.split(","):
        if part in arrays:
            columns.append(part)
            continue
        pattern = any(c in part for c in "*?[")
        matched = [name for name in arrays if pattern and fnmatch.fnmatchcase(name, part) and name not in named]
        if not matched:
            raise CliError(f"{source} has no {what} {part!r} (it holds {', '.join(arrays)})")
        columns += [name for name in matched if name not in columns]
    return columns


def _column_as_matrix(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    """A 1-D array (one value per sample) for an input declared [batch, 1]: as [samples, 1]."""
    if array.ndim == 1 and spec.shape is not None and len(spec.shape) == 2 and spec.shape[1] == 1:
        return array.reshape(-1, 1)
    return array


def _as_input(array: np.ndarray, spec: InputSpec, label: str) -> np.ndarray:
    """A table's column cast to the input's dtype (numbers of the same kind, or integers to floats) and
    reshaped to its declared fixed dimensions."""
    target = np.dtype(spec.dtype)
    kinds = {"f": "f", "i": "fi", "u": "fiu", "b": "fiub"}
    if array.dtype != target:
        if target.kind not in kinds.get(array.dtype.kind, "") or target.kind not in "fiub":
            raise CliError(f"{label} holds {array.dtype.name} values; input {spec.name!r} takes {spec.dtype}")
        array = checked_cast(array, target, label)
    declared = [dim for dim in spec.shape[1:] if isinstance(dim, int)] if spec.shape else []
    if spec.shape and len(declared) == len(spec.shape) - 1 > 1 and array.ndim == 2:
        if array.shape[1] == int(np.prod(declared)):
            array = array.reshape(array.shape[0], *declared)
    return array


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


def split_keys(text: str | None) -> list[str] | None:
    """``"x,y"`` -> ``["x", "y"]``; None stays None."""
    if text is None:
        return None
    keys = [key.strip() for key in text.split(",")]
    if not all(keys):
        raise CliError(f"empty array name in {text!r}: expected KEY1,KEY2,...")
    return keys
