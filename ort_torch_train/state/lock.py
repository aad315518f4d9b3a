"""The lock of a TrainingState: re-entrant, and aware of whether the calling thread is inside a step.

A signal handler runs on the main thread between two bytecodes, possibly in the middle of
``optimizer.step()``; a save it asks for (the usual preemption pattern, SIGTERM -> save) would find
the lock its own thread already holds and write a half-updated state. Such a save is deferred to
the moment the outermost holder releases the lock, when the step is complete.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)


class StateLock:
    """A re-entrant lock whose actions deferred by its holder run when it is released (see the module doc)."""

    __slots__ = ("_deferred", "_depth", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # how many times the holder entered it: its outermost exit runs the deferred actions
        self._deferred: list[tuple[Callable[[], None], str]] = []

    def __enter__(self) -> None:
        self._lock.acquire()
        self._depth += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._deferred and self._depth == 1:
            try:
                self._run_deferred(exc_type)
            finally:
                self._depth -= 1
                self._lock.release()
            return
        self._depth -= 1
        self._lock.release()

    def _run_deferred(self, exc_type: type[BaseException] | None) -> None:
        """The deferred actions, in order; each dropped, with an error logged, where the step failed."""
        while self._deferred:
            action, what = self._deferred.pop(0)
            if exc_type is not None:
                log.error("%s was not done: the step it waited for failed (%s)", what, exc_type.__name__)
                continue
            action()

    def held_by_current_thread(self) -> bool:
        """Whether the calling thread holds the lock (it is inside a step, or a handler interrupted one)."""
        return self._lock._is_owned()  # type: ignore[attr-defined]  # the RLock's own check, as Condition uses

    def defer(self, action: Callable[[], None], what: str) -> None:
        """Run ``action`` when the calling thread, which holds the lock, releases it for good (after
        the step); dropped, with an error logged, when that step fails."""
        if not self.held_by_current_thread():
            raise RuntimeError(f"{what}: defer() needs the calling thread to hold the lock")
        self._deferred.append((action, what))
        log.info("%s deferred: requested while a step of this state runs on this thread; done when it ends", what)
