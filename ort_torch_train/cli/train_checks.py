"""Checks ``train`` makes before the first step, so that nothing it would find only at a save or at the
end of the run costs the run: an output it cannot write, a schedule that ends before the run does."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ort_torch_train.checkpoint.odtc_walk import FILE_IDENTIFIER
from ort_torch_train.cli.common import CliError
from ort_torch_train.fileio import open_regular_file, read_descriptor, require_regular_or_absent


def check_writable_output(path: Path, option: str = "--output") -> None:
    """``path`` can be saved to: not a directory or special file, nor a file other than a checkpoint
    (which a save would replace), and its folder exists (it is created here) and accepts a new file."""
    try:
        require_regular_or_absent(path, f"{option} checkpoint")
        check_replaces_a_checkpoint(path, option)
    except OSError as error:
        raise CliError(f"{option} {str(path)!r}: {error}") from error
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        reason = error.strerror or str(error)
        raise CliError(
            f"{option} {str(path)!r} cannot be written ({reason}: {str(error.filename or folder)!r}); "
            "choose a folder this user can write"
        ) from error


def check_replaces_a_checkpoint(path: Path, option: str) -> None:
    """Refuse an existing ``path`` that is not an ORT checkpoint: a save replaces only a checkpoint."""
    try:
        fd = open_regular_file(path, f"{option} checkpoint")
    except FileNotFoundError:
        return
    try:
        head = bytes(read_descriptor(fd, 0, 8))
    finally:
        os.close(fd)
    if head[4:8] != FILE_IDENTIFIER:
        raise CliError(
            f"{option} {str(path)!r} exists and is not an ORT checkpoint (no {FILE_IDENTIFIER.decode()} header): "
            "a save would replace it; choose a new path, or remove the file yourself"
        )


def check_total_steps(total_steps: int | None, last_step: int) -> None:
    """Refuse a schedule length below the step the run ends at (the steps past it would train at 0)."""
    if total_steps is not None and total_steps < last_step:
        raise CliError(
            f"--total-steps {total_steps} is below the run's last step {last_step}: the schedule would reach "
            f"learning rate 0 at step {total_steps} and train the remaining steps at 0; give --total-steps "
            f">= {last_step}"
        )
