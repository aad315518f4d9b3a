"""Rank processes of the multi-process tests, forked from a server that imported the package once.

Each rank is a process of its own, run as ``python -m MODULE ARGS`` would run it: in its own session (a
kill takes its children too), in the folder and with the environment its test gives it, its output in
files, its exit status its own; ``atexit`` handlers run when the module returns. It starts as a fork of
one server process per pytest-xdist worker (``multiprocessing``'s forkserver), which has imported
``ort_torch_train.api`` (torch, onnx, torch.distributed) with OpenMP on one thread, as the ranks run
(``rank_preload.py``): a rank does not import torch again. The server holds no tensor, thread pool or
process group when it forks, and ends with its pytest worker.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

PRELOAD = ["tests.helpers.rank_preload"]


def _context() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def run_module(module: str, args: Sequence[str], env: Mapping[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The rank's body, in the forked process: ``python -m module args`` with ``env`` in ``cwd``."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for path, fd in ((stdout, 1), (stderr, 2)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()


@dataclass
class Rank:
    """A started rank: its process and the files holding its output."""

    process: BaseProcess
    args: list[str]
    stdout: Path
    stderr: Path

    def kill(self) -> None:
        """SIGKILL to the rank's session (the rank and what it started), once it has one."""
        if self.process.exitcode is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        except (ProcessLookupError, PermissionError):
            self.process.kill()
        self.process.join()

    def completed(self) -> subprocess.CompletedProcess:
        """The finished rank as ``subprocess.run`` reports a process: its arguments, exit status, output."""
        return subprocess.CompletedProcess(self.args, self.process.exitcode, _text(self.stdout), _text(self.stderr))


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def run_ranks(
    module: str, args: Sequence[str], environments: Sequence[Mapping[str, str]], cwd: Path, timeout: float
) -> list[subprocess.CompletedProcess]:
    """One rank of ``module`` per environment, started together; their results once all ended. Past
    ``timeout`` seconds every rank still running is killed and ``subprocess.TimeoutExpired`` is raised."""
    context = _context()
    with tempfile.TemporaryDirectory(prefix="ranks-") as logs:
        ranks = []
        try:
            for index, env in enumerate(environments):
                stdout, stderr = Path(logs, f"{index}.out"), Path(logs, f"{index}.err")
                process = context.Process(
                    target=run_module, args=(module, list(args), dict(env), str(cwd), str(stdout), str(stderr))
                )
                process.start()
                ranks.append(Rank(process, [module, *args], stdout, stderr))
            deadline = time.monotonic() + timeout
            for rank in ranks:
                rank.process.join(max(0.0, deadline - time.monotonic()))
                if rank.process.exitcode is None:
                    raise subprocess.TimeoutExpired(rank.args, timeout)
            return [rank.completed() for rank in ranks]
        finally:
            for rank in ranks:
                rank.kill()
