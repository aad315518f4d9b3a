"""Checkpoint saves are all-or-nothing: kill -9 during saves, a full disk, torn pairs, stale temps."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from ort_torch_train.checkpoint.odtc import external_data_path, read_checkpoint, write_checkpoint
from ort_torch_train.checkpoint.pair import manifest_path
from ort_torch_train.checkpoint.records import CheckpointRecord, OptimizerGroupRecord
from ort_torch_train.errors import CheckpointError

TRIALS = 30


def _record(generation: int, external: bool, numel: int = 4096) -> CheckpointRecord:
    """A checkpoint whose every number says which generation wrote it."""
    value = float(generation)
    params = {f"w{i}": torch.full((numel,), value) for i in range(3)}
    moments = {
        name: {"momentum0": torch.full((numel,), value), "momentum1": torch.full((numel,), value)} for name in params
    }
    return CheckpointRecord(
        trainable=params,
        frozen={},
        optimizer_groups=[OptimizerGroupRecord("group0", generation, 0.1, moments)],
        properties={"generation": generation},
        has_external_data=external,
    )


def _generation(path: Path) -> int:
    """The generation of a loaded checkpoint, after checking that every part agrees on it."""
    record = read_checkpoint(path)
    generation = record.properties["generation"]
    assert record.optimizer_groups[0].step == generation
    for tensor in record.trainable.values():
        assert torch.all(tensor == generation), "parameters from another save than the step"
    for moments in record.optimizer_groups[0].momentums.values():
        for tensor in moments.values():
            assert torch.all(tensor == generation)
    return generation


def _leftovers(path: Path) -> list[str]:
    keep = {path.name, external_data_path(path).name, manifest_path(path).name}
    return sorted(entry.name for entry in os.scandir(path.parent) if entry.is_file() and entry.name not in keep)


def _save_forever(path: Path, external: bool) -> None:
    generation = 1
    while True:
        generation += 1
        write_checkpoint(_record(generation, external), path)


@pytest.mark.slow
@pytest.mark.parametrize("external", [True, False], ids=["external-data", "inline"])
def test_kill_during_save_leaves_old_or_new_pair(tmp_path: Path, external: bool) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(1, external), path)
    rng = random.Random(14)
    for _ in range(TRIALS):
        pid = os.fork()
        if pid == 0:  # the child saves until killed
            try:
                _save_forever(path, external)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.04))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        before = _generation(path)  # loadable and self-consistent after the kill
        assert record_has_external(path) == external
        write_checkpoint(_record(before + 1000, external), path)
        assert _leftovers(path) == [], "temp files survived the next save"
        assert _generation(path) == before + 1000
        write_checkpoint(_record(before, external), path)


def record_has_external(path: Path) -> bool:
    return read_checkpoint(path).has_external_data


def test_torn_pair_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(1, True), path)
    old_checkpoint = path.read_bytes()
    write_checkpoint(_record(2, True), path)
    path.write_bytes(old_checkpoint)  # the old code's torn result: old checkpoint, new data
    with pytest.raises(CheckpointError, match="torn pair"):
        read_checkpoint(path)


def test_pair_rewritten_by_another_tool_still_loads(tmp_path: Path) -> None:
    path, other = tmp_path / "checkpoint", tmp_path / "other" / "checkpoint"
    other.parent.mkdir()
    write_checkpoint(_record(1, True), path)
    write_checkpoint(_record(7, True), other)
    path.write_bytes(other.read_bytes())
    external_data_path(path).write_bytes(external_data_path(other).read_bytes())
    assert _generation(path) == 7


def test_interrupted_commit_is_read_and_finished(tmp_path: Path) -> None:
    """Pending files named by a pending manifest are the checkpoint until the next save moves them."""
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(1, True), path)
    staging = tmp_path / "staging"
    staging.mkdir()
    write_checkpoint(_record(2, True), staging / "checkpoint")
    manifest = manifest_path(staging / "checkpoint").read_text().replace('"pending": false', '"pending": true')
    (tmp_path / ".checkpoint.pending").write_bytes((staging / "checkpoint").read_bytes())
    (tmp_path / ".checkpoint.data.pending").write_bytes(external_data_path(staging / "checkpoint").read_bytes())
    manifest_path(path).write_text(manifest)  # killed right after the commit point
    assert _generation(path) == 2
    os.replace(tmp_path / ".checkpoint.data.pending", external_data_path(path))  # killed between renames
    assert _generation(path) == 2
    write_checkpoint(_record(3, True), path)
    assert _generation(path) == 3 and _leftovers(path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_full_disk_keeps_old_pair(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("tmpfs mount not permitted here")
    try:
        path = mount / "checkpoint"
        write_checkpoint(_record(1, True, numel=4096), path)  # ~100 KB in all
        for generation, numel in ((2, 16384), (3, 8192)):
            with pytest.raises(OSError):
                write_checkpoint(_record(generation, True, numel=numel), path)
            assert _generation(path) == 1
        write_checkpoint(_record(4, True, numel=1024), path)
        assert _generation(path) == 4 and _leftovers(path) == []
    finally:
        subprocess.run(["umount", str(mount)], check=True)
