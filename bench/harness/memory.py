"""Resident memory of this process from /proc (Linux), its peak while a block runs, and runs in a process of
their own (whose peak is theirs alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path


def memory_mib() -> dict[str, float]:
    """VmRSS and its anonymous part (RssAnon; the rest is mapped files), in MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


class RssSampler:
    """The highest VmRSS and RssAnon seen while it runs (``peak``, by field; sampled every millisecond)."""

    def __init__(self) -> None:
        self.peak = memory_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._update()

    def _update(self) -> None:
        for key, value in memory_mib().items():
            self.peak[key] = max(self.peak.get(key, 0.0), value)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._update()


def in_own_process(script: str, *arguments: str, cwd: str | Path | None = None) -> dict:
    """Run ``script`` with ``arguments`` in a new Python process and return the JSON object its last output
    line holds. glibc maps every allocation over 64 KiB there, so freed large tensors leave the resident
    set. Raises SystemExit with the end of its stderr when it fails."""
    completed = subprocess.run(
        [sys.executable, script, *arguments],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    if completed.returncode != 0:
        raise SystemExit(f"{Path(script).name} {' '.join(arguments)} failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])
