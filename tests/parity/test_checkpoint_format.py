"""The ODTC checkpoint format: ORT's files read exactly, written back byte for byte, round trips,
external data, nominal checkpoints and atomic saves. (Corrupted files: test_checkpoint_corruption.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.checkpoint.odtc import (
    CheckpointRecord,
    OptimizerGroupRecord,
    checkpoint_to_bytes,
    external_data_path,
    read_checkpoint,
    write_checkpoint,
)
from ort_torch_train.checkpoint.tensor_bytes import tensor_to_bytes
from ort_torch_train.errors import CheckpointError
from ort_torch_train.graph.fbs_reader import FlatBuffer

FINAL_FILES = ("final_checkpoint_no_optimizer", "final_checkpoint_with_optimizer")


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bits (NaN-safe)."""
    return a.dtype == b.dtype and a.shape == b.shape and tensor_to_bytes(a) == tensor_to_bytes(b)


def assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], ordered: bool = True) -> None:
    assert (list(got) if ordered else sorted(got)) == (list(want) if ordered else sorted(want))
    for name, tensor in want.items():
        assert same_tensor(got[name], tensor), name


def assert_same_records(got: CheckpointRecord, want: CheckpointRecord, ordered: bool = True) -> None:
    assert_same_tensors(got.trainable, want.trainable, ordered)
    assert_same_tensors(got.frozen, want.frozen, ordered)
    assert got.is_nominal == want.is_nominal
    assert got.properties == want.properties
    assert len(got.optimizer_groups) == len(want.optimizer_groups)
    for g, w in zip(got.optimizer_groups, want.optimizer_groups):
        assert (g.name, g.step, g.initial_learning_rate) == (w.name, w.step, w.initial_learning_rate)
        assert (list(g.momentums) if ordered else sorted(g.momentums)) == (
            list(w.momentums) if ordered else sorted(w.momentums)
        )
        for param, moments in w.momentums.items():
            assert_same_tensors(g.momentums[param], moments, ordered)


def rich_record() -> CheckpointRecord:
    """Every supported dtype, scalars, empty tensors, unicode names, moments and properties."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(3, 4, generator=gen)
    weight[0, 0] = float("nan")
    trainable = {
        "w.f32": weight,
        "b.f64": torch.randn(5, generator=gen, dtype=torch.float64),
        "h.f16": torch.randn(2, 3, generator=gen).half(),
        "bf.bf16": torch.randn(7, generator=gen).bfloat16(),
        "scalar": torch.tensor(1.5),
        "层.weight": torch.randn(2, 2, generator=gen),
    }
    frozen = {
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "i16": torch.tensor([-32768, 32767], dtype=torch.int16),
        "i32": torch.tensor([[-(2**31), 2**31 - 1]], dtype=torch.int32),
        "i64": torch.tensor([-(2**63), 2**63 - 1, 7]),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "u16": torch.tensor([65535], dtype=torch.uint16),
        "flags": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
    }
    moments = {
        name: {
            "momentum0": torch.randn(t.shape, generator=gen, dtype=t.dtype),
            "momentum1": torch.rand(t.shape, generator=gen, dtype=t.dtype),
        }
        for name, t in trainable.items()
        if t.dtype in (torch.float32, torch.float64)
    }
    properties = {"epoch": 3, "max": 2**63 - 1, "min": -(2**63), "best_loss": 0.25, "tag": "héllo ✓", "empty": ""}
    return CheckpointRecord(
        trainable, frozen, False, [OptimizerGroupRecord("group0", 7, 0.009999999776482582, moments)], properties
    )


def sorted_record(record: CheckpointRecord) -> CheckpointRecord:
    """The record in the order ORT writes it (tensors sorted by name)."""
    groups = [
        OptimizerGroupRecord(
            g.name,
            g.step,
            g.initial_learning_rate,
            {p: dict(sorted(g.momentums[p].items())) for p in sorted(g.momentums)},
        )
        for g in record.optimizer_groups
    ]
    return CheckpointRecord(
        dict(sorted(record.trainable.items())),
        dict(sorted(record.frozen.items())),
        record.is_nominal,
        groups,
        record.properties,
    )


# ---- the reference corpus (and tests/fixtures) ------------------------------------------------------
def load_case(case: Path, *files: str) -> tuple[dict, dict[str, np.ndarray]]:
    """expected.json and arrays.npz of a case; skips when one of files is absent from it."""
    for file in files:
        if not (case / file).exists():
            pytest.skip(f"{case / file} absent")
    return json.loads((case / "expected.json").read_text()), dict(np.load(case / "arrays.npz"))


def check_parameters(record: CheckpointRecord, expected: dict, arrays: dict, prefix: str) -> None:
    for name, tensor in {**record.trainable, **record.frozen}.items():
        spec = expected["parameters"][name]
        assert spec["requires_grad"] == (name in record.trainable), name
        assert list(tensor.shape) == spec["shape"] and str(tensor.dtype) == f"torch.{spec['dtype']}"
        assert same_tensor(tensor, torch.from_numpy(arrays[prefix + name])), name


def test_generated_checkpoint_matches_expected(corpus_case: Path) -> None:
    expected, arrays = load_case(corpus_case, "artifacts/checkpoint")
    record = read_checkpoint(corpus_case / "artifacts" / "checkpoint")
    params = expected["parameters"]
    order = [n for n in expected.get("base_model_initializers", sorted(params)) if n in params]
    assert list(record.trainable) == [n for n in order if params[n]["requires_grad"]]
    assert list(record.frozen) == [n for n in order if not params[n]["requires_grad"]]
    assert sorted([*record.trainable, *record.frozen]) == expected["checkpoint_parameter_order"]
    check_parameters(record, expected, arrays, "init__")
    assert not record.is_nominal and not record.optimizer_groups and not record.properties

    nominal_path = corpus_case / "artifacts" / "nominal_checkpoint"
    if nominal_path.exists():
        nominal = read_checkpoint(nominal_path)
        assert nominal.is_nominal
        assert (list(nominal.trainable), list(nominal.frozen)) == (list(record.trainable), list(record.frozen))
        for name, tensor in {**nominal.trainable, **nominal.frozen}.items():
            assert tensor.numel() == 0 and str(tensor.dtype) == f"torch.{params[name]['dtype']}"


@pytest.mark.parametrize("file_name", FINAL_FILES)
def test_saved_checkpoint_matches_expected(corpus_case: Path, file_name: str) -> None:
    expected, arrays = load_case(corpus_case, file_name)
    record = read_checkpoint(corpus_case / file_name)
    params = expected["parameters"]
    assert list(record.trainable) == sorted(n for n in params if params[n]["requires_grad"])
    assert list(record.frozen) == sorted(n for n in params if not params[n]["requires_grad"])
    check_parameters(record, expected, arrays, "final__")
    assert record.properties == expected.get("properties_readback", {})
    if file_name == "final_checkpoint_no_optimizer":
        assert record.optimizer_groups == []
        return
    groups = expected["final_checkpoint_optimizer_groups"]
    assert [g.name for g in record.optimizer_groups] == [g["group_name"] for g in groups]
    for group, want in zip(record.optimizer_groups, groups):
        assert (group.step, group.initial_learning_rate) == (want["step"], want["initial_learning_rate"])
        assert list(group.momentums) == want["params"]
        for param, moments in group.momentums.items():
            assert list(moments) == want["momentum_names"]
            for moment, tensor in moments.items():
                key = f"optim_state__{group.name}__{param}__{moment}"
                assert same_tensor(tensor, torch.from_numpy(arrays[key])), key


@pytest.mark.parametrize("file_name", FINAL_FILES)
def test_saved_checkpoint_written_back_byte_identical(corpus_case: Path, file_name: str, tmp_path: Path) -> None:
    load_case(corpus_case, file_name)
    original = (corpus_case / file_name).read_bytes()
    record = read_checkpoint(original)
    assert checkpoint_to_bytes(record) == original
    write_checkpoint(record, tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint").read_bytes() == original


def test_generated_checkpoints_written_back_byte_identical(corpus_case: Path, tmp_path: Path) -> None:
    for name in ("checkpoint", "nominal_checkpoint"):
        path = corpus_case / "artifacts" / name
        if path.exists():
            original = path.read_bytes()
            record = read_checkpoint(original)
            assert checkpoint_to_bytes(record, artifact=True) == original
            write_checkpoint(record, tmp_path / name, artifact=True)
            assert (tmp_path / name).read_bytes() == original
            again = read_checkpoint(checkpoint_to_bytes(record))  # save_checkpoint's layout
            assert_same_records(again, sorted_record(record))


# ---- round trips ----------------------------------------------------------------------------------
def test_round_trip_of_every_dtype_moments_and_properties(tmp_path: Path) -> None:
    record = rich_record()
    assert_same_records(read_checkpoint(checkpoint_to_bytes(record)), sorted_record(record))
    write_checkpoint(record, tmp_path / "ckpt")
    loaded = read_checkpoint(tmp_path / "ckpt")
    assert_same_records(loaded, sorted_record(record))
    assert not external_data_path(tmp_path / "ckpt").exists()
    assert loaded.has_external_data is False


def test_read_tensors_are_owned_writable_cpu_copies() -> None:
    buffer = bytearray(checkpoint_to_bytes(rich_record()))
    record = read_checkpoint(buffer)
    before = record.trainable["scalar"].clone()
    buffer[:] = bytes(len(buffer))
    assert same_tensor(record.trainable["scalar"], before)
    for tensor in {**record.trainable, **record.frozen}.values():
        assert tensor.device.type == "cpu" and tensor.is_contiguous()
    record.trainable["w.f32"].add_(1)  # writable


def test_device_and_non_contiguous_tensors_are_written_as_values() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    record = CheckpointRecord({"t": base.t()}, {})
    assert same_tensor(read_checkpoint(checkpoint_to_bytes(record)).trainable["t"], base.t().contiguous())


def test_write_rejects_what_a_checkpoint_cannot_hold(tmp_path: Path) -> None:
    bad_records = {
        CheckpointError: [
            CheckpointRecord({"c": torch.zeros(2, dtype=torch.complex64)}, {}),
            CheckpointRecord({"a": torch.zeros(1)}, {"a": torch.zeros(1)}),
            CheckpointRecord({}, {}, properties={"big": 2**63}),
        ],
        TypeError: [
            CheckpointRecord({}, {}, properties={"flag": True}),
            CheckpointRecord({}, {}, properties={"none": None}),
            CheckpointRecord({"n": np.zeros(2)}, {}),
        ],
    }
    for error, records in bad_records.items():
        for record in records:
            with pytest.raises(error):
                write_checkpoint(record, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


# ---- external data ------------------------------------------------------------------------------
def tensor_tables(path: Path) -> list:
    """The Tensor tables of a checkpoint file, in the order they were written."""
    root = FlatBuffer(path.read_bytes()).root(b"ODTC")
    module = root.table(1, "module_state")
    tables = module.tables(0, "trainable") + module.tables(1, "frozen")
    for group in root.tables(2, "groups") or []:
        for state in group.tables(3, "states"):
            tables += state.tables(1, "momentums")
    return tables


def write_order(record: CheckpointRecord) -> list[torch.Tensor]:
    """The record's tensors in the order ORT writes them."""
    record = sorted_record(record)
    return [
        *record.trainable.values(),
        *record.frozen.values(),
        *(m for g in record.optimizer_groups for ms in g.momentums.values() for m in ms.values()),
    ]


def test_external_data_layout_and_round_trip(tmp_path: Path) -> None:
    record = rich_record()
    path = tmp_path / "ckpt"
    write_checkpoint(record, path, external_data_threshold=0)
    loaded = read_checkpoint(path)
    assert loaded.has_external_data
    assert_same_records(loaded, sorted_record(record))
    tables, tensors = tensor_tables(path), write_order(record)
    assert len(tables) == len(tensors)
    position = 0
    for table, tensor in zip(tables, tensors):  # ORT's layout: 8-aligned INT64/DOUBLE, else 4
        alignment = 8 if tensor.dtype in (torch.int64, torch.float64) else 4
        position = -(-position // alignment) * alignment
        assert table.vector(4, 1, "raw_data") is None
        assert table.scalar(6, "<q", -1, "external_data_offset") == position
        position += tensor.numel() * tensor.dtype.itemsize
    assert external_data_path(path).stat().st_size == position


def test_artifact_layout_keeps_order_and_small_tensors_inline(tmp_path: Path) -> None:
    record = rich_record()
    with pytest.raises(CheckpointError, match="parameters only"):
        write_checkpoint(record, tmp_path / "ckpt", artifact=True)
    record.optimizer_groups, record.properties = [], {}
    write_checkpoint(record, tmp_path / "ckpt", external_data_threshold=0, artifact=True)
    loaded = read_checkpoint(tmp_path / "ckpt")
    assert_same_records(loaded, record)  # record order kept
    tensors = [*record.trainable.values(), *record.frozen.values()]
    for table, tensor in zip(tensor_tables(tmp_path / "ckpt"), tensors):
        inline = tensor.numel() * tensor.dtype.itemsize < 64  # ORT's kMinimumSizeForExternalData
        assert (table.vector(4, 1, "raw_data") is not None) == inline


def test_loaded_external_checkpoint_saves_parameters_external_and_moments_inline(tmp_path: Path) -> None:
    record = rich_record()
    record.has_external_data = True  # as read from a checkpoint with external data
    write_checkpoint(record, tmp_path / "ckpt")
    tables = tensor_tables(tmp_path / "ckpt")
    params = len(record.trainable) + len(record.frozen)
    assert all(t.vector(4, 1, "raw") is None for t in tables[:params])
    assert all(t.vector(4, 1, "raw") is not None for t in tables[params:])
    assert_same_records(read_checkpoint(tmp_path / "ckpt"), sorted_record(record))
    # bytes are always self-contained
    assert_same_records(read_checkpoint(checkpoint_to_bytes(record)), sorted_record(record))


def test_external_data_errors(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    write_checkpoint(rich_record(), path, external_data_threshold=0)
    with pytest.raises(CheckpointError, match="checkpoint path is not provided"):
        read_checkpoint(path.read_bytes())
    data = external_data_path(path).read_bytes()
    external_data_path(path).write_bytes(data[:-3])
    with pytest.raises(CheckpointError, match="torn pair"):  # the manifest names other data
        read_checkpoint(path)
    Path(f"{path}.manifest").unlink()  # as ORT writes it: no manifest
    with pytest.raises(CheckpointError, match="Failed reading external checkpoint data"):
        read_checkpoint(path)
    external_data_path(path).unlink()
    with pytest.raises(CheckpointError, match=r"ckpt\.data"):
        read_checkpoint(path)


# ---- nominal ---------------------------------------------------------------------------------------
def test_nominal_checkpoint_round_trip(tmp_path: Path) -> None:
    record = CheckpointRecord(
        {"w": torch.empty(0), "b": torch.empty(0, dtype=torch.float64)},
        {"f": torch.empty(0, dtype=torch.int64)},
        is_nominal=True,
        properties={"k": "v"},
    )
    write_checkpoint(record, tmp_path / "nominal", external_data_threshold=0)
    assert not external_data_path(tmp_path / "nominal").exists()
    for table in tensor_tables(tmp_path / "nominal"):
        assert table.int64s(2, "dims") == [] and table.vector(4, 1, "raw_data")[1] == 0
    assert_same_records(read_checkpoint(tmp_path / "nominal"), sorted_record(record))


# ---- paths and atomic writes ---------------------------------------------------------------------
def test_missing_path_and_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing"):
        read_checkpoint(tmp_path / "missing")
    with pytest.raises(IsADirectoryError):
        read_checkpoint(tmp_path)
    with pytest.raises(IsADirectoryError):
        write_checkpoint(rich_record(), tmp_path)
    with pytest.raises(TypeError):
        read_checkpoint(42)


@pytest.mark.parametrize("threshold", [0, 2**40], ids=["external", "inline"])
def test_failed_save_leaves_previous_files_intact(tmp_path: Path, threshold: int) -> None:
    path = tmp_path / "ckpt"
    write_checkpoint(rich_record(), path, external_data_threshold=threshold)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert (external_data_path(path).name in before) == (threshold == 0)
    broken = rich_record()
    broken.frozen["zz.on_meta"] = torch.empty(4, device="meta")  # cannot be copied to the host
    with pytest.raises(NotImplementedError):
        write_checkpoint(broken, path, external_data_threshold=threshold)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp files either
