"""Checkpoint files under concurrent saves and reads, special files, odd manifests, ORT's own re-saves
(issue 29: checkpoint findings)."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ort_torch_train.checkpoint.odtc import checkpoint_to_bytes, external_data_path, read_checkpoint, write_checkpoint
from ort_torch_train.checkpoint.pair import manifest_path
from ort_torch_train.checkpoint.records import CheckpointRecord
from ort_torch_train.errors import CheckpointError, SpecialFileError
from ort_torch_train.fileio import atomic_write, path_lock
from tests.helpers.paths import ROOT
from tests.unit.checkpoint.test_checkpoint_atomic import _generation, _record

SAVER = """
import sys
from pathlib import Path
from tests.unit.checkpoint.test_checkpoint_atomic import _record
from ort_torch_train.checkpoint.odtc import write_checkpoint
path, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for generation in range(first, first + count):
    write_checkpoint(_record(generation, True, numel=1024), path)
print("saved", count)
"""


def _start(script: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for every process (killing all their process groups when one is stuck past timeout)."""
    results, deadline = [], time.monotonic() + timeout
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append((proc.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        pytest.fail(f"a process did not finish within {timeout} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return results


@pytest.mark.slow
def test_read_while_saving_sees_one_saved_pair(tmp_path: Path) -> None:
    """A reader never mixes the parameters of one save with the step and moments of another, and never
    reports a torn pair, while another process keeps saving the checkpoint."""
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(1, True, numel=1024), path)
    writer = _start(SAVER, path, 2, 100_000)
    loads, generations = 0, set()
    try:
        started = time.monotonic() + 30
        while _generation(path) == 1 and time.monotonic() < started and writer.poll() is None:
            time.sleep(0.01)  # the writer is still importing torch
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and writer.poll() is None:
            generations.add(_generation(path))  # asserts that every part comes from one save
            loads += 1
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        _, stderr = writer.communicate()
    assert loads > 20 and len(generations) > 5, (loads, generations, stderr[-2000:])


@pytest.mark.slow
def test_concurrent_saves_to_one_path_all_succeed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    savers = [_start(SAVER, path, 1000 * (index + 1), 12) for index in range(3)]
    for returncode, _, stderr in _finish(savers, timeout=60):
        assert returncode == 0, stderr[-3000:]
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


LOADER = """
import sys
from ort_torch_train.checkpoint.odtc import read_checkpoint
for path in sys.argv[1:]:
    try:
        read_checkpoint(path)
        print("loaded")
    except Exception as error:
        print(type(error).__name__, error)
"""


@pytest.mark.slow
def test_special_manifest_or_checkpoint_fails_fast(tmp_path: Path) -> None:
    """A FIFO or /dev/zero at the checkpoint's or the manifest's path is refused at once (in a child
    process under a hard timeout and a 2 GB memory cap: it used to hang or read forever)."""
    paths = []
    for special in ("fifo", "dev-zero"):
        for victim in ("manifest", "checkpoint"):
            path = tmp_path / f"{special}-{victim}" / "checkpoint"
            path.parent.mkdir()
            write_checkpoint(_record(1, True), path)
            target = manifest_path(path) if victim == "manifest" else path
            target.unlink()
            if special == "fifo":
                os.mkfifo(target)
            else:
                target.symlink_to("/dev/zero")
            paths.append(path)
    limit = 2 << 30
    loader = subprocess.Popen(
        [sys.executable, "-c", LOADER, *map(str, paths)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    ((_, stdout, stderr),) = _finish([loader], timeout=30)
    lines = stdout.splitlines()
    assert len(lines) == len(paths), stderr[-3000:]
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
