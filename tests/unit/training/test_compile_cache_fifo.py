"""A FIFO where the compile cache expects its key or an entry file is refused at once: opening it never
waits for a writer (the open is non-blocking and the type is checked on the descriptor)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from ort_torch_train.errors import InputError
from ort_torch_train.training.compile.cache_store import CacheStore, RefusedEntry


def outcome_within(seconds: float, call: Callable[[], object], fifo: str) -> BaseException | None:
    """What ``call`` raised (None: it returned); fails when it is still blocked on ``fifo`` after ``seconds``."""
    raised: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as error:  # handed to the test
            raised.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer releases the blocked open
        pytest.fail(f"still blocked after {seconds} s")
    return raised[0]


def test_a_fifo_as_the_key_or_an_entry_is_refused_without_blocking(tmp_path) -> None:
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    os.mkfifo(directory / "key", 0o600)
    error = outcome_within(10, lambda: CacheStore(directory), str(directory / "key"))
    assert isinstance(error, InputError) and "key is not a file" in str(error)

    store = CacheStore(tmp_path / "other")
    entry = store.path_of("step", "k", "f")
    os.mkfifo(entry, 0o600)
    error = outcome_within(10, lambda: store.read("step", "k", "f"), str(entry))
    assert isinstance(error, RefusedEntry) and "is not a file" in str(error)
