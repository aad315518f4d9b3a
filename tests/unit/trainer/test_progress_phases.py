"""``progress.Phase`` under ``phases_shown``: what a terminal and a log file see as a phase starts, ends
or fails."""

from __future__ import annotations

import io
import logging

import pytest

from ort_torch_train.progress import Phase, phases_shown

log = logging.getLogger("ort_torch_train.tests.phases")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_an_uncounted_phase_shows_its_start_on_a_terminal_and_its_seconds_when_it_ends(monkeypatch, terminal) -> None:
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    with phases_shown():
        with Phase(log, "checking the inputs", done="checked the inputs") as phase:
            started = stderr.getvalue()
    assert started == ("checking the inputs ...\n" if terminal else "")
    assert stderr.getvalue() == f"{started}checked the inputs in {phase.seconds:.1f} s\n"


def test_a_failing_phase_shows_nothing_more_and_logs_its_failure(monkeypatch, caplog) -> None:
    stderr = Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    with caplog.at_level(logging.INFO, logger=log.name), phases_shown(), pytest.raises(ValueError, match="bad"):
        with Phase(log, "checking the inputs"):
            raise ValueError("bad input")
    assert stderr.getvalue() == "checking the inputs ...\n"  # the caller reports the error itself
    assert "checking the inputs: failed after" in caplog.text


def test_outside_phases_shown_a_phase_only_logs(monkeypatch) -> None:
    stderr = Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    with Phase(log, "checking the inputs"):
        pass
    assert stderr.getvalue() == ""
