"""The rank side of ``dist_grouped_launch``: a worker's scenarios run in turn, each marked done or failed.

Imports nothing but the standard library: every rank of every launch loads it."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path


def run_scenarios(scenarios: Sequence[str], out: Path, rank: int, run: Callable[[str], None]) -> None:
    """In a rank: ``run`` each scenario in turn, marking each done; the first that raises is written to
    ``<scenario>_rank<r>.failed`` and ends this process at once (its peers fail on their next collective)."""
    for scenario in scenarios:
        try:
            run(scenario)
        except BaseException:
            (out / f"{scenario}_rank{rank}.failed").write_text(traceback.format_exc())
            sys.stderr.write(traceback.format_exc())
            sys.stderr.flush()
            os._exit(1)
        (out / f"{scenario}_rank{rank}.done").write_text(scenario)
