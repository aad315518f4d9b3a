"""Models loaded in the wrong slot are named; the outputs a user can export are listed (by the API and by the
export error), for ORT-made artifacts (guessed) and generate_artifacts ones (recorded)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.artifacts import LossType, generate_artifacts
from ort_torch_train.errors import ModelError
from tests.helpers.paths import FIXTURES


def open_case(name: str) -> tuple[Path, CheckpointState]:
    artifacts = FIXTURES / name / "artifacts"
    return artifacts, CheckpointState.load_checkpoint(artifacts / "checkpoint")


@pytest.mark.parametrize(
    "case, optimizer_model",
    [("cnn", "artifacts/optimizer_model.onnx"), ("mlp_optimizers", "optimizers/adamw_wd_clip.onnx")],
)
def test_optimizer_model_as_training_model_is_named(case: str, optimizer_model: str) -> None:
    _, state = open_case(case)
    with pytest.raises(
        ModelError,
        match=r"train_model_uri: got an optimizer model \(it holds AdamWOptimizer\); "
        r"expected the training model \(training_model.onnx",
    ):
        Module(FIXTURES / case / optimizer_model, state)


def test_training_model_as_eval_model_is_named() -> None:
    artifacts, state = open_case("cnn")
    with pytest.raises(ModelError, match=r"eval_model_uri: got a training model .*expected the eval model"):
        Module(artifacts / "training_model.onnx", state, artifacts / "training_model.onnx")
    Module(artifacts / "eval_model.onnx", state)  # an eval model trains through autograd: accepted


@pytest.mark.parametrize("case", ["cnn", "bce", "l1", "regress_mse_sgd"])
def test_exportable_outputs_of_ort_made_artifacts(case) -> None:
    artifacts, state = open_case(case)
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    names = module.exportable_output_names()
    assert names[0] == "logits" and names[-1] == module.output_names()[0]  # the model's output, then the loss


def test_generate_artifacts_records_the_outputs_and_the_export_error_lists_them(tmp_path) -> None:
    base = onnx.load(FIXTURES / "cnn" / "artifacts" / "eval_model.onnx")
    # a base model: the CNN's eval graph cut before its loss, parameters back as initializers
    state = CheckpointState.load_checkpoint(FIXTURES / "cnn" / "artifacts" / "checkpoint")
    module = Module(
        FIXTURES / "cnn" / "artifacts" / "training_model.onnx",
        state,
        FIXTURES / "cnn" / "artifacts" / "eval_model.onnx",
    )
    module.export_model_for_inferencing(tmp_path / "base.onnx", ["logits"])
    generate_artifacts(
        onnx.load(tmp_path / "base.onnx"),
        requires_grad=[i.name for i in base.graph.input if i.name in state.parameters],
        loss=LossType.CrossEntropyLoss,
        artifact_directory=tmp_path / "artifacts",
    )
    state = CheckpointState.load_checkpoint(tmp_path / "artifacts" / "checkpoint")
    module = Module(tmp_path / "artifacts" / "training_model.onnx", state, tmp_path / "artifacts" / "eval_model.onnx")
    assert module.exportable_output_names()[0] == "logits"
    with pytest.raises(ModelError, match=r"could not be found.*outputs you can export: logits, "):
        module.export_model_for_inferencing(tmp_path / "out.onnx", ["output"])
