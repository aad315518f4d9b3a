"""A module for tests/unit/test_rank_processes.py to run as a rank: ``python -m tests.helpers.rank_probe MODE``.

``report``: prints its folder, ``PROBE_VALUE`` and whether torch was imported before it ran, writes ``to stderr``
on stderr, registers an atexit handler that prints ``atexit ran``, and exits with status 3. ``stuck``: starts
a child that sleeps, writes both pids to ``pids`` in its folder, and sleeps.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    if sys.argv[1] == "report":
        print(os.getcwd(), os.environ.get("PROBE_VALUE"), "torch" in sys.modules, flush=True)
        print("to stderr", file=sys.stderr)
        atexit.register(print, "atexit ran")
        sys.exit(3)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open("pids.tmp", "w") as pids:
        pids.write(f"{os.getpid()} {child.pid}")
    os.replace("pids.tmp", "pids")
    time.sleep(300)
