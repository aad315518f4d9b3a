"""Several scenarios of a rank worker run in turn in one launch of its ranks, shared by every test of a run.

Launching ranks costs each one a torch import and a process group; tests whose scenarios run on the same
world size share one launch instead (``grouped_launch``), made once per test run for every pytest-xdist
worker (``shared_builds.built_once``). Each scenario keeps its own verdict: a rank marks a scenario done
once it finished it (``dist_rank_scenarios.run_scenarios``); one that raises on a rank ends that launch, is recorded as failed
with the ranks' output, and the scenarios after it are launched again without it. A test asks for its
scenario's folder with ``GroupedLaunch.folder``, which fails the test with that scenario's own message.
"""

from __future__ import annotations

import json
import subprocess
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.shared_builds import built_once

FAILURES = "failures.json"


@dataclass(frozen=True)
class GroupedLaunch:
    """The folder a group's scenarios wrote to, and the failure message of each that failed."""

    out: Path
    scenarios: tuple[str, ...]
    failures: dict[str, str]

    def folder(self, scenario: str) -> Path:
        """The group's folder, holding ``scenario``'s results; the test fails if that scenario failed."""
        if scenario not in self.scenarios:
            pytest.fail(f"{scenario!r} is not a scenario of the shared launch in {self.out}: {self.scenarios}")
        if scenario in self.failures:
            pytest.fail(f"scenario {scenario!r} failed:\n{self.failures[scenario]}")
        return self.out


def ranks_output(results: Sequence[subprocess.CompletedProcess]) -> str:
    """Each rank's exit status and the end of its stderr, for a failed scenario's message."""
    return "".join(f"rank {rank} exited {r.returncode}:\n{r.stderr[-4000:]}\n" for rank, r in enumerate(results))


Launch = Callable[[list[str], Path], Sequence[subprocess.CompletedProcess]]


def grouped_launch(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    scenarios: Sequence[str],
    world_size: int,
    launch: Launch,
    in_process: Callable[[str, Path], bool] | None = None,
    prepare: Callable[[Path], None] | None = None,
) -> GroupedLaunch:
    """``scenarios`` run once in this test run under the shared folder ``name``: first ``prepare(out)``, then
    the ones ``in_process`` takes (``in_process(scenario, out)`` returns False for a scenario of the launch),
    then the rest by ``launch(scenarios, out)``, which starts ``world_size`` ranks and returns their processes; a failed
    scenario's message is its exception, or its ranks' output (ranks that finished every scenario but exited
    with an error fail every scenario of that launch)."""

    def build(out: Path) -> None:
        out.mkdir(parents=True)
        failures: dict[str, str] = {}
        if prepare is not None:
            prepare(out)
        launched = []
        for scenario in scenarios:
            try:
                if in_process is None or not in_process(scenario, out):
                    launched.append(scenario)
            except Exception:
                failures[scenario] = traceback.format_exc()
        while launched:
            try:
                results = launch(launched, out)
                output, exited_well = ranks_output(results), all(r.returncode == 0 for r in results)
            except pytest.fail.Exception as error:  # a rank stuck past the timeout: every rank was killed
                output, exited_well = str(error), False
            finished = [s for s in launched if all((out / f"{s}_rank{r}.done").is_file() for r in range(world_size))]
            if len(finished) == len(launched):
                if not exited_well:
                    failures.update({s: f"the ranks ran it, then exited with an error:\n{output}" for s in launched})
                break
            failed = next(s for s in launched if s not in finished)
            written = "".join(p.read_text() for p in sorted(out.glob(f"{failed}_rank*.failed")))
            failures[failed] = f"{written}\nthe ranks' output:\n{output[-8000:]}"
            launched = launched[launched.index(failed) + 1 :]
        (out / FAILURES).write_text(json.dumps(failures))

    out = built_once(tmp_path_factory, name, build)
    return GroupedLaunch(out, tuple(scenarios), json.loads((out / FAILURES).read_text()))
