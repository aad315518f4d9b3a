"""ONNX models past protobuf's 2 GB: weights in ``<model>.data``, never serialised as one proto.

An initializer is either inline (its data in the proto) or held outside it: by an ONNX external-data
reference to a file (``weights_in_files``) or by a torch tensor handed to ``write_model``. The
writer streams every weight to the data file one tensor at a time.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import torch

from ort_torch_train.dtypes import onnx_elem_type, torch_dtype
from ort_torch_train.errors import ModelError
from ort_torch_train.fileio import atomic_write, atomic_write_bytes
from ort_torch_train.graph.layout import copy_field

# Above this many bytes of initializer data a model is written with external data (protobuf's 2 GiB,
# less room for the graph). Read at call time: tests lower it to force external data on small models.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**20
MIN_EXTERNAL_BYTES = 1024  # smaller initializers stay in the proto (onnx's own default)
_ALIGNMENT = 64
_COPY_CHUNK = 64 * 1024 * 1024


def is_external(init: onnx.TensorProto) -> bool:
    """Whether the initializer's data lies outside the proto."""
    return init.data_location == onnx.TensorProto.EXTERNAL


def tensor_nbytes(init: onnx.TensorProto) -> int:
    """Bytes of the initializer's data, wherever it lies (computed from dims and dtype)."""
    count = int(np.prod(init.dims, dtype=np.int64)) if init.dims else 1
    if init.data_type == onnx.TensorProto.STRING:
        return sum(len(value) for value in init.string_data)
    return count * torch_dtype(init.data_type).itemsize


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of all the model's initializer data, inline or external."""
    return sum(tensor_nbytes(init) for init in model.graph.initializer)


def external_reference(init: onnx.TensorProto) -> onnx.TensorProto:
    """A data-less copy of ``init`` marked external (its data supplied separately to ``write_model``)."""
    reference = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
    reference.data_location = onnx.TensorProto.EXTERNAL
    reference.external_data.add(key="location", value="")
    return reference


def placeholder(tensor: torch.Tensor, name: str) -> onnx.TensorProto:
    """A data-less external initializer shaped like ``tensor`` (its data handed to ``write_model``)."""
    return external_reference(onnx.TensorProto(name=name, data_type=onnx_elem_type(tensor.dtype), dims=tensor.shape))


def weights_in_files(model: onnx.ModelProto, directory: Path) -> dict[str, torch.Tensor]:
    """The data of ``model``'s external initializers, memory-mapped (copy-on-write) from ``directory``."""
    return {init.name: mapped_tensor(init, directory) for init in model.graph.initializer if is_external(init)}


def mapped_tensor(init: onnx.TensorProto, directory: Path) -> torch.Tensor:
    """One external initializer's data as a tensor mapped from its file (pages read on first use)."""
    info = {entry.key: entry.value for entry in init.external_data}
    location = info.get("location", "")
    path = (directory / location).resolve()
    if not location or os.path.isabs(location) or not path.is_relative_to(directory.resolve()):
        raise ModelError(
            f"initializer {init.name!r}: external data location {location!r} must be a relative path inside "
            f"{str(directory)!r}"
        )
    offset, nbytes = int(info.get("offset", 0)), tensor_nbytes(init)
    if "length" in info and int(info["length"]) != nbytes:
        raise ModelError(
            f"initializer {init.name!r}: external data length {info['length']} but dims need {nbytes} bytes"
        )
    if not path.is_file() or path.stat().st_size < offset + nbytes:
        raise ModelError(
            f"initializer {init.name!r}: external data file {str(path)!r} must hold bytes "
            f"[{offset}, {offset + nbytes}) (missing or too short)"
        )
    dtype = torch_dtype(init.data_type)
    if nbytes == 0:
        return torch.empty(list(init.dims), dtype=dtype)
    raw = np.memmap(path, dtype=np.uint8, mode="c", offset=offset, shape=(nbytes,))
    return torch.from_numpy(raw).view(dtype).reshape(list(init.dims))


def write_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    weights: Mapping[str, torch.Tensor] | None = None,
    external_data: bool = False,
    threshold: int | None = None,
    outside: Collection[str] = (),
    references: Mapping[str, onnx.TensorProto] | None = None,
) -> dict[str, onnx.TensorProto]:
    """Write ``model`` atomically; ``weights`` supply the data of its external initializers.

    The data go to ``<name>.data`` beside it when asked (then every initializer's), or, past ``threshold``
    bytes of initializers (default ``EXTERNAL_DATA_THRESHOLD``), those of ``MIN_EXTERNAL_BYTES`` or more;
    the initializers named in ``outside`` go there in any case. Those in ``references`` are written as
    these external references (data another model's file already holds, in the same folder).
    Returns the external reference written for each initializer placed in ``<name>.data``.
    """
    weights, references = weights or {}, references or {}
    target = Path(path)
    limit = EXTERNAL_DATA_THRESHOLD if threshold is None else threshold
    missing = [
        init.name
        for init in model.graph.initializer
        if is_external(init) and init.name not in weights and init.name not in references
    ]
    if missing:
        raise ModelError(f"initializers {missing[:5]} are external but no data was given for them")
    inline = not external_data and initializer_bytes(model) <= limit
    if inline and not outside and not references:
        atomic_write_bytes(target, _with_inline_weights(model, weights).SerializeToString())
        return {}
    light = without_initializers(model)
    placed: list[tuple[int, onnx.TensorProto]] = []
    written: dict[str, onnx.TensorProto] = {}
    size = 0
    data_name = target.name + ".data"
    for init in model.graph.initializer:
        if init.name in references:
            light.graph.initializer.append(references[init.name])
            continue
        nbytes = tensor_nbytes(init)
        small = nbytes < (0 if external_data else MIN_EXTERNAL_BYTES) or init.data_type == onnx.TensorProto.STRING
        if small or (inline and init.name not in outside):
            light.graph.initializer.append(_inline(init, weights))
            continue
        offset = -(-size // _ALIGNMENT) * _ALIGNMENT
        reference = external_reference(init)
        del reference.external_data[:]
        for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(nbytes))):
            reference.external_data.add(key=key, value=value)
        light.graph.initializer.append(reference)
        written[init.name] = reference
        placed.append((offset, init))
        size = offset + nbytes
    if not placed and not references:  # every initializer is small: nothing to put outside the proto
        atomic_write_bytes(target, _with_inline_weights(model, weights).SerializeToString())
        return {}

    def write_data(file: BinaryIO) -> None:
        for offset, init in placed:
            file.write(b"\0" * (offset - file.tell()))
            for chunk in _data_chunks(init, weights):
                file.write(chunk)

    if placed:
        atomic_write(target.parent / data_name, write_data)
    atomic_write_bytes(target, light.SerializeToString())
    return written


def shared_initializers(first: onnx.ModelProto, second: onnx.ModelProto) -> set[str]:
    """The initializers of ``MIN_EXTERNAL_BYTES`` or more that both models hold under one name with the same
    dtype, shape and data (external ones: the same data by name, as ``write_model``'s ``weights`` give it)."""
    theirs = {init.name: init for init in second.graph.initializer}
    shared = set()
    for init in first.graph.initializer:
        other = theirs.get(init.name)
        if other is None or tensor_nbytes(init) < MIN_EXTERNAL_BYTES or init.data_type == onnx.TensorProto.STRING:
            continue
        if is_external(init) and is_external(other) and init.dims == other.dims and init.data_type == other.data_type:
            shared.add(init.name)
        elif init == other:
            shared.add(init.name)
    return shared


def _data_chunks(init: onnx.TensorProto, weights: Mapping[str, torch.Tensor]) -> Iterator[memoryview | bytes]:
    if init.name in weights and is_external(init):
        flat = weights[init.name].detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        for start in range(0, flat.size, _COPY_CHUNK):
            yield flat[start : start + _COPY_CHUNK].data
    elif init.HasField("raw_data"):
        yield init.raw_data
    else:
        yield onnx.numpy_helper.to_array(init).tobytes()


def _inline(init: onnx.TensorProto, weights: Mapping[str, torch.Tensor]) -> onnx.TensorProto:
    if not is_external(init):
        return init
    inline = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
    inline.raw_data = b"".join(_data_chunks(init, weights))
    return inline


def _with_inline_weights(model: onnx.ModelProto, weights: Mapping[str, torch.Tensor]) -> onnx.ModelProto:
    if not any(is_external(init) for init in model.graph.initializer):
        return model
    light = without_initializers(model)
    light.graph.initializer.extend(_inline(init, weights) for init in model.graph.initializer)
    return light


def without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with no initializers, made without copying their data."""
    copy = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(copy, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            copy_field(copy.graph, field, value)
    return copy
