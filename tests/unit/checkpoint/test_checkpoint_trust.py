"""Checkpoint files under concurrent saves and reads, special files, odd manifests, ORT's own re-saves
(issue 29: checkpoint findings)."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ort_torch_train.checkpoint.odtc import checkpoint_to_bytes, external_data_path, read_checkpoint, write_checkpoint
from ort_torch_train.checkpoint.pair import manifest_path
from ort_torch_train.checkpoint.records import CheckpointRecord
from ort_torch_train.errors import CheckpointError, SpecialFileError
from ort_torch_train.fileio import atomic_write, path_lock
from tests.helpers.timeouts import scaled
from tests.unit.checkpoint.test_checkpoint_atomic import _generation, _record


def _fork(work: Callable[[], None]) -> int:
    """A child process running ``work`` (exit code 0 when it returns, 1 when it raises)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    return pid


def _reap(pids: list[int], timeout: float) -> list[int]:
    """The children's exit codes; fails (after killing them) when one is stuck past timeout."""
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(codes) < len(pids) and time.monotonic() < deadline:
            for pid in set(pids) - set(codes):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
    finally:
        for pid in set(pids) - set(codes):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert len(codes) == len(pids), f"a child did not finish within {timeout} s"
    return [codes[pid] for pid in pids]


def _saves(path: Path, first: int, count: int) -> Callable[[], None]:
    def save() -> None:
        for generation in range(first, first + count):
            write_checkpoint(_record(generation, True, numel=1024), path)

    return save


@pytest.mark.slow
def test_read_while_saving_sees_one_saved_pair(tmp_path: Path) -> None:
    """A reader never mixes the parameters of one save with the step and moments of another, and never
    reports a torn pair, while another process keeps saving the checkpoint."""
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(1, True, numel=1024), path)
    writer = _fork(_saves(path, 2, 10**9))
    loads, generations = 0, set()
    try:
        saving_until = time.monotonic() + 2
        while time.monotonic() < saving_until:
            generations.add(_generation(path))  # asserts that every part comes from one save
            loads += 1
    finally:
        os.kill(writer, signal.SIGKILL)
        os.waitpid(writer, 0)
    assert loads > 20 and len(generations) > 5, (loads, generations)


@pytest.mark.slow
def test_concurrent_saves_to_one_path_all_succeed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    savers = [_fork(_saves(path, 1000 * (index + 1), 12)) for index in range(3)]
    assert _reap(savers, timeout=scaled(60)) == [0, 0, 0]
    assert _generation(path) in {1000 * (index + 1) + 11 for index in range(3)}  # one save's pair, whole
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "checkpoint.data", "checkpoint.manifest"]


def _device_copy(tmp_path: Path) -> Path:
    """A character device node of our own (a copy of /dev/null's numbers), or skip where none can be made."""
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as error:
        pytest.skip(f"cannot make a device node here: {error}")
    return node


@pytest.mark.parametrize("external", [True, False], ids=["external-data", "inline"])
def test_save_onto_a_device_or_fifo_is_refused_and_leaves_it(tmp_path: Path, external: bool) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    targets = [fifo, _device_copy(tmp_path)]
    for target in targets:
        kind = stat.S_IFMT(os.stat(target).st_mode)
        with pytest.raises(SpecialFileError, match="not a regular file"):
            write_checkpoint(_record(1, external), target)
        assert stat.S_IFMT(os.stat(target).st_mode) == kind, f"{target} was replaced"
    regular = tmp_path / "checkpoint"
    os.mkfifo(external_data_path(regular))  # the data file's path counts too
    with pytest.raises(SpecialFileError, match="external data file"):
        write_checkpoint(_record(1, True), regular)
    assert stat.S_ISFIFO(os.stat(external_data_path(regular)).st_mode)


def test_special_manifest_or_checkpoint_fails_fast(tmp_path: Path) -> None:
    """A FIFO or /dev/zero at the checkpoint's, its data file's or the manifest's path is refused at once (in a child
    process under a hard timeout and a 2 GB memory cap: it used to hang or read forever)."""
    paths = []
    for special in ("fifo", "dev-zero"):
        for victim in ("manifest", "checkpoint", "data"):
            path = tmp_path / f"{special}-{victim}" / "checkpoint"
            path.parent.mkdir()
            write_checkpoint(_record(1, True), path)
            target = {"manifest": manifest_path(path), "checkpoint": path, "data": external_data_path(path)}[victim]
            target.unlink()
            if special == "fifo":
                os.mkfifo(target)
            else:
                target.symlink_to("/dev/zero")
            paths.append(path)
    report = tmp_path / "errors.txt"

    def load_each() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        for path in paths:
            try:
                read_checkpoint(path)
                outcome = "loaded"
            except Exception as error:
                outcome = f"{type(error).__name__} {error}"
            with open(report, "a") as file:
                file.write(outcome.replace("\n", " ") + "\n")

    assert _reap([_fork(load_each)], timeout=scaled(20)) == [0]
    lines = report.read_text().splitlines()
    assert len(lines) == len(paths)
    for path, line in zip(paths, lines):
        assert line.startswith("CheckpointError") and "regular file" in line, (path, line)


def _torn(path: Path) -> None:
    """The checkpoint of generation 1 beside the data of generation 2 (written in place)."""
    write_checkpoint(_record(1, True), path)
    old_checkpoint = path.read_bytes()
    write_checkpoint(_record(2, True), path)
    path.write_bytes(old_checkpoint)


def test_manifest_with_an_extra_key_still_catches_a_torn_pair(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    _torn(path)
    manifest = json.loads(manifest_path(path).read_text())
    manifest["checkpoint"]["written_by"] = "a newer version"
    manifest["data"]["written_by"] = "a newer version"
    manifest["note"] = "extra"
    manifest_path(path).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="torn pair"):
        read_checkpoint(path)


@pytest.mark.parametrize("text", ["{not json", '{"checkpoint": 1}', "\udcff"], ids=["json", "fields", "binary"])
def test_malformed_manifest_does_not_block_saves(tmp_path: Path, text: str) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(1, True), path)
    manifest_path(path).write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(CheckpointError, match="malformed|cannot be read"):
        read_checkpoint(path)  # a load says so (and how to proceed)
    write_checkpoint(_record(2, True), path)
    assert _generation(path) == 2
    manifest_path(path).write_text("{}")
    write_checkpoint(_record(3, False), path)  # an inline save too
    assert _generation(path) == 3 and not manifest_path(path).exists()


def test_overflowing_dims_with_a_zero_are_named(tmp_path: Path) -> None:
    record = CheckpointRecord(trainable={"w": torch.ones(4)}, frozen={"empty": torch.zeros(0, 2, 2)})
    data = checkpoint_to_bytes(record)
    dims = struct.pack("<I3q", 3, 0, 2, 2)
    assert data.count(dims) == 1
    bomb = data.replace(dims, struct.pack("<I3q", 3, 0, 2**62, 2**62))
    with pytest.raises(CheckpointError, match=r"'empty'.*dims \[0, 4611686018427387904, 4611686018427387904\]"):
        read_checkpoint(bomb)


def test_a_write_interrupting_a_write_in_the_same_thread_is_refused(tmp_path: Path) -> None:
    """A signal handler's low-level save during a save would wait for its own thread's lock forever."""
    path = tmp_path / "checkpoint"
    inner: list[BaseException] = []

    def write_again(file: object) -> None:
        try:
            write_checkpoint(_record(2, True), path)
        except RuntimeError as error:
            inner.append(error)

    with path_lock(tmp_path / "other"):
        atomic_write(tmp_path / "scratch", write_again)
    assert inner and "already writing a file" in str(inner[0])
    write_checkpoint(_record(3, True), path)
    assert _generation(path) == 3
