"""Fixtures of the integration tests."""

from __future__ import annotations

import importlib
import os
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


GENAI_MODELS = [
    "llama:fp32",
    "llama:int4",
    "qwen2:fp32",
    "qwen2:int4",
    "phi3:fp32",
    "phi3:int4",
    "smollm:fp32",
    "smollm:int4",
    "qwen2.5:fp32",
    "qwen2.5:int4",
    "gemma2:fp32",
    "gemma2:int4",
]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny onnxruntime-genai builder models by ``arch-precision``, built once for the xdist workers together."""
    pytest.importorskip("onnxruntime_genai")
    from tests.helpers.genai_models import built_models

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' temp folders share this session's parent
        root = root.parent
    return built_models(root / "genai-models", GENAI_MODELS)
