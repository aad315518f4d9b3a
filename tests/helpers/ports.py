"""Ports for the rendezvous of the multi-process tests.

A port taken from the kernel (bind to port 0) comes from its ephemeral range, where every client socket
and gloo's own listeners also take theirs: between the test closing it and torchrun binding it, another
process may hold it (EADDRINUSE). These ports come from below that range instead, and each pytest-xdist
worker draws from its own share of it, so two tests running at once never pick the same one.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOWEST = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _first_ephemeral_port() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def free_port() -> int:
    """A port nothing listens on, outside the ephemeral range, in this xdist worker's share."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    share = (_first_ephemeral_port() - LOWEST) // workers
    first = LOWEST + worker * share
    for port in random.sample(range(first, first + share), min(share, 200)):
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + share - 1}")
