"""Malformed checkpoints are rejected with CheckpointError: never a crash, hang or huge allocation.

Crafted files (a small FlatBuffers builder below) cover each semantic check; generic corruptions of
real checkpoints (truncations, byte flips, offsets and lengths overwritten) cover the verifier.
"""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import flatbuffers
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ort_torch_train.checkpoint.odtc import (
    CheckpointRecord,
    checkpoint_to_bytes,
    external_data_path,
    read_checkpoint,
    write_checkpoint,
)
from ort_torch_train.checkpoint.records import OptimizerGroupRecord
from ort_torch_train.errors import CheckpointError
from ort_torch_train.graph.fbs_reader import VERIFICATION_FAILED

FLOAT, INT64, STRING, COMPLEX64 = 1, 7, 8, 14
ONE_FLOAT = struct.pack("<f", 1.0)


def craft(
    tensors: list[dict],
    *,
    version: int = 2,
    frozen: list[dict] | None = None,
    external: bool = False,
    nominal: bool = False,
    ints: list[tuple[str, int]] = (),
) -> bytes:
    """An ODTC buffer with exactly the given fields; a tensor dict holds any of name, dims,
    data_type, raw, external_offset (absent keys are left out of the table)."""
    b = flatbuffers.Builder(1024)

    def tensor(spec: dict) -> int:
        name = b.CreateString(spec["name"]) if "name" in spec else None
        dims = None
        if "dims" in spec:
            b.StartVector(8, len(spec["dims"]), 8)
            for dim in reversed(spec["dims"]):
                b.PrependInt64(dim)
            dims = b.EndVector()
        raw = b.CreateByteVector(spec["raw"]) if "raw" in spec else None
        b.StartObject(7)
        for slot, offset in ((0, name), (2, dims), (4, raw)):
            if offset is not None:
                b.PrependUOffsetTRelativeSlot(slot, offset, 0)
        b.PrependInt32Slot(3, spec.get("data_type", FLOAT), 0)
        if "external_offset" in spec:
            b.PrependInt64Slot(6, spec["external_offset"], -1)
        return b.EndObject()

    def vector(offsets: list[int]) -> int:
        b.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            b.PrependUOffsetTRelative(offset)
        return b.EndVector()

    trainable = vector([tensor(spec) for spec in tensors])
    frozen_vector = vector([tensor(spec) for spec in frozen or []])
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, trainable, 0)
    b.PrependUOffsetTRelativeSlot(1, frozen_vector, 0)
    b.PrependBoolSlot(2, nominal, False)
    b.PrependBoolSlot(3, external, False)
    module = b.EndObject()
    properties = []
    for name, value in ints:
        name_offset = b.CreateString(name)
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(0, name_offset, 0)
        b.PrependInt64Slot(1, value, 0)
        properties.append(b.EndObject())
    ints_vector = vector(properties)
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, ints_vector, 0)
    bag = b.EndObject()
    b.StartObject(4)
    b.PrependInt32Slot(0, version, 0)
    b.PrependUOffsetTRelativeSlot(1, module, 0)
    b.PrependUOffsetTRelativeSlot(3, bag, 0)
    b.Finish(b.EndObject(), file_identifier=b"ODTC")
    return bytes(b.Output())


GOOD = {"name": "w", "dims": [1], "data_type": FLOAT, "raw": ONE_FLOAT}

CRAFTED_ERRORS = {
    "version 1": (dict(tensors=[GOOD], version=1), "version 1 is not supported"),
    "version 3": (dict(tensors=[GOOD], version=3), "version 3 is not supported"),
    "version absent": (dict(tensors=[GOOD], version=0), "version 0 is not supported"),
    "negative dim": (dict(tensors=[{**GOOD, "dims": [2, -1]}]), "negative dimension"),
    "huge dims": (dict(tensors=[{**GOOD, "dims": [2**40, 2**40]}]), "overflows int64"),
    "raw too long": (dict(tensors=[{**GOOD, "raw": ONE_FLOAT * 2}]), "holds 8 bytes"),
    "raw empty": (dict(tensors=[{**GOOD, "dims": [3], "raw": b""}]), "need 12"),
    "string type": (dict(tensors=[{**GOOD, "data_type": STRING}]), "STRING"),
    "complex type": (dict(tensors=[{**GOOD, "data_type": COMPLEX64}]), "COMPLEX64"),
    "unknown type": (dict(tensors=[{**GOOD, "data_type": 99}]), "unknown 99"),
    "no name": (dict(tensors=[{k: v for k, v in GOOD.items() if k != "name"}]), "no name"),
    "no dims": (dict(tensors=[{k: v for k, v in GOOD.items() if k != "dims"}]), "no dims"),
    "no data": (dict(tensors=[{k: v for k, v in GOOD.items() if k != "raw"}]), "neither"),
    "undeclared external": (dict(tensors=[{**GOOD, "external_offset": 0}]), "has_external_data"),
    "duplicate name": (dict(tensors=[GOOD], frozen=[GOOD]), "more than once"),
    "duplicate property": (dict(tensors=[GOOD], ints=[("a", 1), ("a", 2)]), "more than once"),
}


@pytest.mark.parametrize("case", CRAFTED_ERRORS)
def test_crafted_invalid_checkpoint_is_rejected(case: str) -> None:
    kwargs, message = CRAFTED_ERRORS[case]
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(craft(**kwargs))


def test_crafted_builder_makes_valid_files() -> None:
    record = read_checkpoint(craft([GOOD], ints=[("epoch", 3)]))
    assert record.trainable["w"].tolist() == [1.0] and record.properties == {"epoch": 3}


def test_nominal_tensors_keep_dtype_and_ignore_data() -> None:
    """ORT re-saves a nominal state with scalar dims and 4 bytes of data per tensor."""
    record = read_checkpoint(
        craft(
            [{**GOOD, "dims": []}, {"name": "e", "dims": [], "raw": b""}],
            frozen=[{**GOOD, "name": "i", "data_type": INT64, "dims": []}],
            nominal=True,
        )
    )
    assert record.is_nominal
    assert [(t.dtype, t.numel()) for t in record.trainable.values()] == [(torch.float32, 0)] * 2
    assert record.frozen["i"].dtype == torch.int64 and record.frozen["i"].numel() == 0


def test_external_offset_beyond_side_file(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    path.write_bytes(
        craft(
            [{**{k: v for k, v in GOOD.items() if k != "raw"}, "dims": [2**20], "external_offset": 2**62}],
            external=True,
        )
    )
    external_data_path(path).write_bytes(bytes(16))
    with pytest.raises(CheckpointError, match="Failed reading external checkpoint data"):
        read_checkpoint(path)


def test_tensors_sharing_external_data_are_rejected(tmp_path: Path) -> None:
    """Many tensors pointing at one region would multiply memory use: refused."""
    path = tmp_path / "ckpt"
    shared = {"dims": [4], "data_type": FLOAT, "external_offset": 0}
    path.write_bytes(craft([{**shared, "name": f"t{i}"} for i in range(3)], external=True))
    external_data_path(path).write_bytes(bytes(16))
    with pytest.raises(CheckpointError, match="share external data"):
        read_checkpoint(path)


# ---- generic corruptions ---------------------------------------------------------------------------
def sample_checkpoint() -> bytes:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(4, 3, generator=gen)
    record = CheckpointRecord(
        {"w": weight, "b": torch.randn(4, generator=gen)},
        {"steps": torch.arange(3)},
        optimizer_groups=[
            OptimizerGroupRecord(
                "group0", 2, 0.01, {"w": {"momentum0": torch.randn(4, 3, generator=gen), "momentum1": torch.rand(4, 3)}}
            )
        ],
        properties={"epoch": 1, "loss": 0.5, "tag": "x"},
    )
    return checkpoint_to_bytes(record)


def load_or_reject(data: bytes) -> CheckpointRecord | None:
    """Either a record or CheckpointError, in well under a second: anything else fails the test."""
    start = time.perf_counter()
    try:
        return read_checkpoint(data)
    except CheckpointError:
        return None
    finally:
        assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", bytes(7), bytes(8), b"ODTC" * 2, b"\xff" * 64],
    ids=["empty", "1 byte", "7 zeros", "8 zeros", "ODTCODTC", "0xff"],
)
def test_tiny_inputs_fail_verification(data: bytes) -> None:
    with pytest.raises(CheckpointError, match=VERIFICATION_FAILED):
        read_checkpoint(data)


def test_wrong_identifier_and_onnx_file() -> None:
    data = bytearray(sample_checkpoint())
    data[4:8] = b"ORTM"
    with pytest.raises(CheckpointError, match="file identifier is b'ORTM'"):
        read_checkpoint(bytes(data))
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(CheckpointError, match=VERIFICATION_FAILED):
        read_checkpoint(onnx.helper.make_model(graph).SerializeToString())


def test_random_bytes_are_rejected() -> None:
    rng = random.Random(0)
    for _ in range(100):
        data = bytearray(rng.randbytes(rng.randrange(8, 2048)))
        if rng.random() < 0.5:
            data[4:8] = b"ODTC"  # get past the identifier check
        assert load_or_reject(bytes(data)) is None


def test_every_truncation_is_rejected_or_loses_only_padding() -> None:
    data = sample_checkpoint()
    for cut in range(len(data)):
        record = load_or_reject(data[:cut])
        if record is not None:  # only trailing padding can go without notice
            assert checkpoint_to_bytes(record) == data


def test_offset_root_out_of_range_names_the_problem() -> None:
    data = bytearray(sample_checkpoint())
    data[0:4] = struct.pack("<I", 0xFFFFFFF0)
    with pytest.raises(CheckpointError, match=r"Checkpoint verification failed\. root: offset"):
        read_checkpoint(bytes(data))


def test_fuzzed_mutations_load_or_raise_checkpoint_error() -> None:
    data = sample_checkpoint()
    rng = random.Random(1234)
    words = [0, 1, 3, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, len(data), len(data) - 4, 2**20]
    outcomes = {"loaded": 0, "rejected": 0}
    for _ in range(400):
        mutated = bytearray(data)
        kind = rng.randrange(3)
        if kind == 0:  # a random byte
            mutated[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:  # one flipped bit
            position = rng.randrange(len(data))
            mutated[position] ^= 1 << rng.randrange(8)
        else:  # an aligned 32-bit word (offsets, lengths, vtable entries) set to an odd value
            position = rng.randrange(len(data) // 4) * 4
            mutated[position : position + 4] = struct.pack("<I", rng.choice(words))
        record = load_or_reject(bytes(mutated))
        outcomes["loaded" if record is not None else "rejected"] += 1
    assert outcomes["rejected"] > 50 and outcomes["loaded"] > 50  # both paths were exercised


def test_corrupted_file_on_disk_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    write_checkpoint(CheckpointRecord({"w": torch.ones(3)}, {}), path)
    path.write_bytes(path.read_bytes()[:-9])
    with pytest.raises(CheckpointError, match=VERIFICATION_FAILED):
        read_checkpoint(path)
