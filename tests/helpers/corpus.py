"""One reference case (refcorpus or tests/fixtures): ORT's artifacts, the data fed and what ORT produced."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ort_torch_train.api import CheckpointState, Module, Optimizer
from tests.helpers.paths import FIXTURES, REFCORPUS


def corpus_cases() -> list[Path]:
    """Every case directory (one holding ``expected.json``) of the refcorpus and of tests/fixtures."""
    return [
        case
        for root in (REFCORPUS, FIXTURES)
        if root.is_dir()
        for case in sorted(root.iterdir())
        if (case / "expected.json").is_file()
    ]


def loss_of(outputs) -> float:
    """The loss as a float: the only output, or the first of several (a list, tuple or array)."""
    first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    return float(np.asarray(first.numpy() if hasattr(first, "numpy") else first).reshape(-1)[0])


@dataclass
class Case:
    root: Path
    expected: dict = field(init=False)

    def __post_init__(self) -> None:
        self.expected = json.loads((self.root / "expected.json").read_text())

    @property
    def name(self) -> str:
        return self.root.name

    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        with np.load(self.root / "arrays.npz") as arrays:
            return dict(arrays)

    @cached_property
    def data(self) -> dict[str, np.ndarray]:
        with np.load(self.root / "data.npz") as data:
            return dict(data)

    def artifact(self, name: str) -> Path:
        return self.root / "artifacts" / name

    @property
    def param_names(self) -> list[str]:
        return list(self.expected["parameters"])

    @property
    def trainable_names(self) -> list[str]:
        return [n for n, p in self.expected["parameters"].items() if p["requires_grad"]]

    @property
    def steps(self) -> int:
        return len(self.expected["train"]["losses"])

    def _input_keys(self, split: str) -> list[str]:
        keys = self.expected.get("data_keys", {}).get(split)
        return keys if keys else [f"x_{split}", f"y_{split}"]

    def train_inputs(self, step: int) -> list[np.ndarray]:
        return [self.data[key][step] for key in self._input_keys("train")]

    def eval_inputs(self) -> list[np.ndarray]:
        return [self.data[key] for key in self._input_keys("eval")]

    def lr_before(self, step: int) -> float:
        return self.expected["train"]["lr_before_each_step"][step]

    @property
    def deterministic(self) -> bool:
        """False where ORT's training step draws random numbers (dropout)."""
        return not self.expected.get("nondeterministic_training", False)

    def load_state(self) -> CheckpointState:
        return CheckpointState.load_checkpoint(self.artifact("checkpoint"))

    def module(self, state: CheckpointState | None = None, *, eval_model: bool = True, device: str = "cpu") -> Module:
        state = state or self.load_state()
        evaluation = self.artifact("eval_model.onnx") if eval_model else None
        return Module(self.artifact("training_model.onnx"), state, evaluation, device=device)

    def optimizer(self, module: Module, implementation: str | None = None) -> Optimizer:
        return Optimizer(self.artifact("optimizer_model.onnx"), module, implementation=implementation)
