"""The numbered checkpoints ``SaveCheckpoints(keep_last=N)`` writes (``PATH.step-<step>`` with its ``.data``
and ``.manifest``): which ones this run wrote (a checkpoint property, so a resumed run knows its own), the
check that none of another's is in the way, and their removal."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from ort_torch_train.checkpoint.pair import data_file_path, manifest_path
from ort_torch_train.errors import CheckpointError, InputError
from ort_torch_train.trainer.fit_state import FitState

WRITTEN_PROPERTY = "ort_torch_train.keep_last.written"  # JSON: the names of the numbered checkpoints kept


def step_checkpoint_path(path: str | Path, step: int) -> Path:
    """Where ``SaveCheckpoints`` keeps the numbered checkpoint of ``step``: ``PATH.step-<step>``."""
    path = Path(path)
    return path.with_name(f"{path.name}.step-{step}")


def checkpoint_files(path: Path) -> list[Path]:
    """The files a save of the checkpoint ``path`` may write: the checkpoint, its external data, its manifest."""
    return [path, data_file_path(path), manifest_path(path)]


def written_numbered(run: FitState, path: Path) -> list[str]:
    """The names of the numbered checkpoints of ``path`` this run (and the runs it resumes) wrote and kept
    in ``path``'s folder, oldest first (names, so that a checkpoint's bytes do not depend on its folder)."""
    text = run.properties.get(WRITTEN_PROPERTY)
    if text is None:
        return []
    try:
        written = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        written = None
    if not isinstance(written, list) or not all(isinstance(item, str) for item in written):
        raise CheckpointError(f"checkpoint property {WRITTEN_PROPERTY!r} is {text!r}: expected a JSON list of names")
    pattern = re.compile(re.escape(path.name) + r"\.step-[1-9][0-9]*$")
    return [name for name in written if pattern.match(name)]


def check_numbered_names(path: Path, run: FitState, every: int) -> None:
    """Refuse to start when a numbered checkpoint this run will write (by ``run.target_step`` when known)
    is there already and is not one of this run's."""
    ours = set(written_numbered(run, path))
    pattern = re.compile(re.escape(path.name) + r"\.step-([1-9][0-9]*)(\.data|\.manifest)?$")
    for entry in path.parent.iterdir():
        match = pattern.match(entry.name)
        if match is None:
            continue
        step = int(match.group(1))
        planned = step > run.step and step % every == 0
        if run.target_step is not None:
            planned = planned and step <= run.target_step
        if planned and step_checkpoint_path(path, step).name not in ours:
            raise InputError(
                f"{str(entry)!r} is in the way: keep_last would write the numbered checkpoint of step {step} "
                f"there, and it was not written by this run (another run's, or a file of yours); move it, "
                "or save this run under another output path"
            )


def remove_checkpoint_files(path: Path) -> None:
    """Delete the numbered checkpoint ``path`` and its ``.data`` and ``.manifest`` (regular files only)."""
    for file in checkpoint_files(path):
        try:
            if stat.S_ISREG(os.lstat(file).st_mode):
                file.unlink(missing_ok=True)  # under data parallelism every rank prunes
        except FileNotFoundError:
            pass
