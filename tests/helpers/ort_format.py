"""ORT-format (.ort) model files, made by the installed onnxruntime itself from an ONNX model it can run."""

from __future__ import annotations

from pathlib import Path

import pytest


def save_in_ort_format(onnx_model: Path, target: Path) -> Path:
    """``onnx_model`` saved by onnxruntime's inference session in ORT format at ``target``."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(target)
    options.add_session_config_entry("session.save_model_format", "ORT")
    options.log_severity_level = 3
    ort.InferenceSession(str(onnx_model), options, providers=["CPUExecutionProvider"])
    return target
