"""The rank processes of the multi-process tests (tests/helpers/rank_processes.py) behave as
``python -m MODULE`` processes: their folder, environment, output, exit status and atexit handlers; one
stuck past its timeout is killed with what it started."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.rank_processes import run_ranks
from tests.helpers.timeouts import scaled

PROBE = "tests.helpers.rank_probe"


def test_a_rank_runs_as_its_own_process_in_its_folder_and_environment(tmp_path: Path) -> None:
    environments = [{**os.environ, "PROBE_VALUE": value} for value in ("a", "b")]
    results = run_ranks(PROBE, ["report"], environments, tmp_path, timeout=scaled(120))
    for result, value in zip(results, "ab", strict=True):
        assert result.returncode == 3
        assert result.stdout.splitlines() == [f"{tmp_path} {value} True", "atexit ran"]
        assert result.stderr == "to stderr\n"


def test_a_rank_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_ranks(PROBE, ["stuck"], [dict(os.environ)], tmp_path, timeout=scaled(2))
    pids = [int(pid) for pid in (tmp_path / "pids").read_text().split()]
    deadline = time.monotonic() + scaled(10)  # the child, a zombie once killed, is reaped by init
    while [pid for pid in pids if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if _alive(pid)] == []


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
