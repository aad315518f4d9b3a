"""A fixture's train step exported as ``ort-torch-train package`` exports it, for the tests of the passes that
rewrite a package's programs."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile.step_spec import ParameterPlan
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.package import build, program_build, programs
from tests.helpers.paths import FIXTURES


def exported_train_step(case: str, decomposed: bool = False) -> tuple[torch.export.ExportedProgram, list[Tensor], int]:
    """The fixture ``case``'s train step exported with its dynamic axes (skipped where the fixture is absent;
    ``decomposed``: to ATen's core operations, as inductor lowers it), its trainable and frozen parameters and zero
    gradients with the reset flag, and how many user inputs it takes."""
    folder = FIXTURES / case / "artifacts"
    if not folder.is_dir():
        pytest.skip(f"fixture {case} not present")
    state = TrainingState.load(folder / "checkpoint")
    engine = TrainingEngine(build._model(folder, "training_model"), state, None, EngineOptions.of())
    names = list(engine.train_layout.params)
    plan = ParameterPlan.of(names, engine.trainable_parameter_names)
    trainable = [state.params[name].detach().clone() for name in engine.trainable_parameter_names]
    frozen = [state.params[name].detach().clone() for name in plan.frozen_names(names)]
    examples = program_build.examples(engine.train_graph, 8)
    inputs, axes = examples.inputs, examples.axes
    module = program_build.converted(engine.train_graph, inputs, [state.params[name] for name in names])
    example = [*inputs, *trainable, *frozen, *(torch.zeros_like(t) for t in trainable), torch.tensor(True)]
    exported = programs.export_step(
        programs.train_function(module, len(inputs), plan), example, [*axes, *([None] * (len(example) - len(inputs)))]
    )
    return (exported.run_decompositions() if decomposed else exported), example[len(inputs) :], len(inputs)
