"""safetensors files through ort_torch_train.checkpoint.safetensors (the safetensors package, the project's
errors, atomic writes); files it writes are read by the package and the other way round."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.checkpoint.safetensors import load_safetensors, save_safetensors
from ort_torch_train.errors import SafetensorsError


def sample_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 4, generator=gen),
        "d": torch.randn(2, generator=gen).double(),
        "h": torch.randn(5, generator=gen).half(),
        "bf": torch.randn(3, generator=gen).bfloat16(),
        "i64": torch.tensor([-(2**63), 2**63 - 1]),
        "i32": torch.tensor([7], dtype=torch.int32),
        "i16": torch.tensor([-3], dtype=torch.int16),
        "i8": torch.tensor([-128], dtype=torch.int8),
        "u8": torch.tensor([255], dtype=torch.uint8),
        "flags": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "模型.权重": torch.ones(1),
    }


def raw_file(path: Path, header: dict | bytes, data: bytes = b"") -> Path:
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def test_round_trip_every_dtype_with_metadata(tmp_path: Path) -> None:
    tensors = sample_tensors()
    save_safetensors(tensors, tmp_path / "t.safetensors", metadata={"format": "pt", "k": "ü"})
    loaded, metadata = load_safetensors(tmp_path / "t.safetensors")
    assert metadata == {"format": "pt", "k": "ü"}
    assert sorted(loaded) == sorted(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape
        assert torch.equal(loaded[name], tensor), name


def test_layout_is_aligned_and_contiguous(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "t.safetensors"
    save_safetensors(tensors, path)
    data = path.read_bytes()
    header_size = struct.unpack_from("<Q", data)[0]
    assert header_size % 8 == 0
    header = json.loads(data[8 : 8 + header_size])
    assert "__metadata__" not in header
    position = 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, end = entry["data_offsets"]
        assert begin == position and begin % tensors[name].dtype.itemsize == 0
        position = end
    assert 8 + header_size + position == len(data)


def test_non_contiguous_tensors_and_empty_dict(tmp_path: Path) -> None:
    base = torch.arange(6.0).reshape(2, 3)
    save_safetensors({"t": base.t()}, tmp_path / "a")
    assert torch.equal(load_safetensors(tmp_path / "a")[0]["t"], base.t())
    save_safetensors({}, tmp_path / "b")
    assert load_safetensors(tmp_path / "b") == ({}, {})


ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD_FILES = {
    "header past end": (b"{}", b"", "header length"),
    "not json": (b"{nope", b"", "invalid JSON"),
    "not utf-8": (b"\xff\xfe", b"", "invalid UTF-8"),
    "json list": (b"[]", b"", "invalid type: sequence"),
    "unknown dtype": ({"t": {**ENTRY, "dtype": "X32"}}, bytes(8), "X32"),
    "negative shape": ({"t": {**ENTRY, "shape": [-2]}}, bytes(8), "-2"),
    "float shape": ({"t": {**ENTRY, "shape": [2.0]}}, bytes(8), "2.0"),
    "bool shape": ({"t": {**ENTRY, "shape": [True, True]}}, bytes(8), "boolean"),
    "size mismatch": ({"t": {**ENTRY, "shape": [3]}}, bytes(8), "shape"),
    "reversed offsets": ({"t": {**ENTRY, "data_offsets": [8, 0]}}, bytes(8), "offset"),
    "missing field": ({"t": {"dtype": "F32", "shape": [2]}}, bytes(8), "data_offsets"),
    "gap": ({"t": {**ENTRY, "data_offsets": [4, 12]}}, bytes(12), "offset"),
    "overlap": ({"a": ENTRY, "b": ENTRY}, bytes(8), "offset"),
    "trailing bytes": ({"t": ENTRY}, bytes(12), "not fully covered"),
    "missing data": ({"t": ENTRY}, bytes(4), "not fully covered"),
    "bad metadata": ({"__metadata__": {"k": 1}}, b"", "expected a string"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_malformed_files_are_rejected(case: str, tmp_path: Path) -> None:
    header, data, message = BAD_FILES[case]
    path = raw_file(tmp_path / "bad", header, data)
    if case == "header past end":
        path.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(SafetensorsError, match=message) as error:
        load_safetensors(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    "data", [b"", bytes(7), struct.pack("<Q", 2**63) + b"{}"], ids=["empty", "7 bytes", "absurd header length"]
)
def test_truncated_or_absurd_header_is_rejected(data: bytes, tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(data)
    with pytest.raises(SafetensorsError):
        load_safetensors(tmp_path / "bad")


def test_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_safetensors(tmp_path / "missing")
    with pytest.raises(IsADirectoryError):
        load_safetensors(tmp_path)


def test_save_rejects_what_it_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "t"
    with pytest.raises(SafetensorsError, match="__metadata__"):
        save_safetensors({"__metadata__": torch.ones(1)}, path)
    with pytest.raises(SafetensorsError, match="complex128"):
        save_safetensors({"c": torch.zeros(1, dtype=torch.complex128)}, path)
    with pytest.raises(SafetensorsError, match="dense"):
        save_safetensors({"s": torch.eye(2).to_sparse()}, path)
    with pytest.raises(TypeError, match="list"):
        save_safetensors({"l": [1.0]}, path)
    with pytest.raises(TypeError, match="str to str"):
        save_safetensors({}, path, metadata={"k": 1})
    assert not path.exists()


def test_failed_save_leaves_previous_file_intact(tmp_path: Path) -> None:
    path = tmp_path / "t"
    save_safetensors({"a": torch.ones(2)}, path)
    before = path.read_bytes()
    with pytest.raises(NotImplementedError):
        save_safetensors({"a": torch.ones(2), "m": torch.empty(2, device="meta")}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["t"]


def test_files_cross_read_with_the_safetensors_package(tmp_path: Path) -> None:
    """What save_safetensors writes, the package's load_file and safe_open read (metadata included),
    and what the package's save_file writes, load_safetensors reads."""
    tensors = sample_tensors()
    save_safetensors(tensors, tmp_path / "ours", metadata={"format": "pt", "k": "ü"})
    theirs = safetensors.torch.load_file(str(tmp_path / "ours"))
    assert sorted(theirs) == sorted(tensors)
    assert all(theirs[n].dtype == t.dtype and torch.equal(theirs[n], t) for n, t in tensors.items())
    with safetensors.safe_open(str(tmp_path / "ours"), framework="pt") as file:
        assert file.metadata() == {"format": "pt", "k": "ü"}
    safetensors.torch.save_file(tensors, str(tmp_path / "theirs"), metadata={"k": "v"})
    loaded, metadata = load_safetensors(tmp_path / "theirs")
    assert metadata == {"k": "v"} and sorted(loaded) == sorted(tensors)
    assert all(loaded[n].dtype == t.dtype and torch.equal(loaded[n], t) for n, t in tensors.items())


def test_views_of_one_flat_buffer_save(tmp_path: Path) -> None:
    """Parameters bound as views of one flat buffer (how a Module holds them) save one by one;
    overlapping views are refused with the project's error."""
    flat = torch.arange(10.0)
    save_safetensors({"a": flat[:4], "b": flat[4:].view(2, 3)}, tmp_path / "t")
    loaded, _ = load_safetensors(tmp_path / "t")
    assert torch.equal(loaded["a"], flat[:4]) and torch.equal(loaded["b"], flat[4:].view(2, 3))
    with pytest.raises(SafetensorsError, match="share memory"):
        save_safetensors({"a": flat[:6], "b": flat[4:]}, tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_a_trained_modules_parameters_cross_read(mlp_case, tmp_path: Path) -> None:
    """CheckpointState.save_safetensors after a train step (parameters bound into the Module's flat
    buffers) is read by the package; a file the package writes loads back into the state in place."""
    state = CheckpointState.load_checkpoint(mlp_case.artifact("checkpoint"))
    module = Module(mlp_case.artifact("training_model.onnx"), state, mlp_case.artifact("eval_model.onnx"))
    optimizer = Optimizer(mlp_case.artifact("optimizer_model.onnx"), module)
    module(*mlp_case.train_inputs(0))
    optimizer.step()
    trained = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    state.save_safetensors(tmp_path / "ours.safetensors")
    assert safetensors.torch.load_file(str(tmp_path / "ours.safetensors")).keys() == trained.keys()
    assert all(
        torch.equal(t, trained[n]) for n, t in safetensors.torch.load_file(str(tmp_path / "ours.safetensors")).items()
    )
    safetensors.torch.save_file({n: t + 1 for n, t in trained.items()}, str(tmp_path / "theirs.safetensors"))
    state.load_safetensors(tmp_path / "theirs.safetensors")
    assert all(torch.equal(module.state_dict()[n], t + 1) for n, t in trained.items())
