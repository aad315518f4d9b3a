"""Fixtures of the integration tests."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest

from tests.helpers.paths import EXAMPLES


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import an example script by name (examples/ on sys.path, as when run from the repo root)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module
