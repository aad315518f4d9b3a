"""Fixtures of the integration tests."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.paths import EXAMPLES


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import an example script by name (examples/ on sys.path, as when run from the repo root)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module


GENAI_MODELS = ["llama:fp32", "llama:int4", "qwen2:int4", "phi3:fp32"]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny onnxruntime-genai builder models by ``arch-precision``, built once for the xdist workers together."""
    pytest.importorskip("onnxruntime_genai")
    from tests.helpers.genai_models import built_models

    return built_models(tmp_path_factory.getbasetemp().parent / "genai-models", GENAI_MODELS)
