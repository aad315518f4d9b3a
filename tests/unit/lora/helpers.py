"""A small MLP and its LoRA artifacts for the unit tests (no tests here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.lora import LoraConfig


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def make_artifacts(directory: Path, lora: LoraConfig | None, model: torch.nn.Module | None = None) -> None:
    generate_artifacts(
        model if model is not None else mlp(),
        example_inputs=(torch.zeros(6, 8),),
        input_names=["features"],
        output_names=["logits"],
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        lora=lora,
    )


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 8), dtype=np.float32)
    return x, x[:, :4].argmax(axis=1).astype(np.int64)


def trained(directory: Path, steps: int = 5, seed: int = 0, lora: LoraConfig | None = None) -> Module:
    """A Module on ``directory``'s artifacts trained ``steps`` AdamW steps on ``data(seed)``."""
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx", lora=lora)
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.05)
    x, y = data(seed)
    for _ in range(steps):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    return module
