"""``run_local_ranks``, the benchmarks' launcher: each rank's output, and every rank killed and reaped
when one fails or they outlive the deadline."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from ort_torch_train.distributed.launch import run_local_ranks
from tests.helpers.timeouts import scaled

PRINT_RANK = "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'])"


def test_each_rank_runs_with_torchruns_variables() -> None:
    outputs = run_local_ranks([sys.executable, "-c", PRINT_RANK], 2, scaled(30))
    ranks = [output.split() for output in outputs]
    assert [rank[:2] for rank in ranks] == [["0", "2"], ["1", "2"]] and ranks[0][2] == ranks[1][2]


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize(
    "rank0, message",
    [
        ("raise SystemExit(3)", r"rank 0 exited with status 3"),  # a failure ends the others at once
        ("time.sleep(300)", r"ranks \[0, 1\] still running after \d+ s: killed"),
    ],
)
def test_a_failure_or_the_deadline_kills_and_reaps_every_rank(tmp_path: Path, rank0: str, message: str) -> None:
    # rank 1 and a child it starts would sleep for minutes; rank 0 acts once their pids are written
    pids = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"    open({str(pids) + '.tmp'!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        f"    os.rename({str(pids) + '.tmp'!r}, {str(pids)!r})\n"
        "    time.sleep(300)\n"
        f"while not os.path.exists({str(pids)!r}):\n"
        "    time.sleep(0.05)\n"
        f"{rank0}\n"
    )
    deadline = scaled(20) if "SystemExit" in rank0 else scaled(3)  # rank 1 writes its pids within a second
    with pytest.raises(RuntimeError, match=message):
        run_local_ranks([sys.executable, "-c", script], 2, deadline)
    left = [int(pid) for pid in pids.read_text().split()]
    assert len(left) == 2
    for _ in range(100):  # SIGKILL is delivered at once; the kernel may take a moment to end the processes
        if not any(running(pid) for pid in left):
            break
        time.sleep(0.05)
    assert not any(running(pid) for pid in left), left
