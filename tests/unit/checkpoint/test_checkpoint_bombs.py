"""Small checkpoints that point many times at one shared vector are refused fast and cheaply."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc

import flatbuffers
import pytest

from ort_torch_train.checkpoint.odtc import read_checkpoint
from ort_torch_train.errors import CheckpointError
from tests.helpers.timeouts import scaled


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _finish(b: flatbuffers.Builder, tensors: list[int], properties: list[int], nominal: bool) -> bytes:
    trainable, frozen = _offsets(b, tensors), _offsets(b, [])
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, trainable, 0)
    b.PrependUOffsetTRelativeSlot(1, frozen, 0)
    b.PrependBoolSlot(2, nominal, False)
    module = b.EndObject()
    ints = _offsets(b, properties)
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, ints, 0)
    bag = b.EndObject()
    b.StartObject(4)
    b.PrependInt32Slot(0, 2, 0)
    b.PrependUOffsetTRelativeSlot(1, module, 0)
    b.PrependUOffsetTRelativeSlot(3, bag, 0)
    b.Finish(b.EndObject(), file_identifier=b"ODTC")
    return bytes(b.Output())


def shared_dims_bomb(dims: int = 100_000, tensors: int = 3000) -> bytes:
    """One dims vector of 100k entries (800 KB) named by thousands of tensors (~0.9 MB)."""
    b = flatbuffers.Builder(1 << 20)
    b.StartVector(8, dims, 8)
    for _ in range(dims):
        b.PrependInt64(1)
    shared = b.EndVector()
    tables = []
    for i in range(tensors):
        name = b.CreateString(f"t{i}")
        b.StartObject(7)
        b.PrependUOffsetTRelativeSlot(0, name, 0)
        b.PrependUOffsetTRelativeSlot(2, shared, 0)
        b.PrependInt32Slot(3, 1, 0)
        tables.append(b.EndObject())
    return _finish(b, tables, [], nominal=True)


def shared_property_bomb(references: int = 250_000, name_bytes: int = 4096) -> bytes:
    """One int property with a 4 KB name, referenced 250k times (~1 MB)."""
    b = flatbuffers.Builder(1 << 20)
    name = b.CreateString("p" * name_bytes)
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependInt64Slot(1, 7, 0)
    prop = b.EndObject()
    return _finish(b, [], [prop] * references, nominal=True)


@pytest.mark.parametrize("make", [shared_dims_bomb, shared_property_bomb], ids=["shared-dims", "shared-property"])
def test_memory_bomb_is_refused_fast_and_small(make) -> None:
    data = make()
    assert len(data) < 1_200_000
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(CheckpointError, match="shared with|more than once"):
            read_checkpoint(data)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] - len(data)
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0 and peak < 100 * 2**20, (elapsed, peak)


@pytest.mark.slow
def test_inspect_refuses_the_bomb(tmp_path) -> None:
    path = tmp_path / "bomb"
    path.write_bytes(shared_dims_bomb())
    result = subprocess.run(
        [sys.executable, "-m", "ort_torch_train", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert result.returncode != 0 and "shared with" in result.stderr and "Traceback" not in result.stderr
