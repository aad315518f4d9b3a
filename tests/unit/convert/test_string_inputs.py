"""String inputs that feed a Cast to a number: parsed on the host (as ORT's Cast does), then trained through Module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.convert.string_inputs import numeric_inputs
from ort_torch_train.errors import InputTypeError, UnsupportedOperatorError
from tests.helpers.ort_peer import requires_ort, run_ort

RNG = np.random.default_rng(3)
FEATURES = RNG.standard_normal((5, 4, 3)).astype(np.float32)  # five batches
TARGETS = RNG.standard_normal((5, 4, 2)).astype(np.float32)


def text_model(input_type: int = TensorProto.STRING, reader: str = "Cast") -> onnx.ModelProto:
    """text[batch, 3] -> Cast(float) -> Gemm(fc.weight, fc.bias) -> Relu -> logits[batch, 2]."""
    attrs = {"to": TensorProto.FLOAT} if reader == "Cast" else {}
    graph = helper.make_graph(
        [
            helper.make_node(reader, ["text"], ["features"], **attrs),
            helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["hidden"], transB=1),
            helper.make_node("Relu", ["hidden"], ["logits"]),
        ],
        "text",
        [helper.make_tensor_value_info("text", input_type, ["batch", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [
            numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32), "fc.weight"),
            numpy_helper.from_array(np.full(2, 0.5, np.float32), "fc.bias"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def train(directory: Path, model: onnx.ModelProto, batches) -> list[float]:
    generate_artifacts(
        model,
        requires_grad=["fc.weight", "fc.bias"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
    )
    module = Module(
        directory / "training_model.onnx",
        CheckpointState.load_checkpoint(directory / "checkpoint"),
        directory / "eval_model.onnx",
    )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    losses = []
    for features, target in zip(batches, TARGETS):
        losses.append(float(module(features, target)))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    losses.append(float(module(batches[0], TARGETS[0])))
    return losses


def test_a_string_input_cast_to_float_trains_like_the_float_model(tmp_path: Path) -> None:
    as_text = [np.array([[repr(float(v)) for v in row] for row in batch]) for batch in FEATURES]
    as_text[1] = as_text[1].astype(object)  # object arrays of str, and bytes, are accepted too
    as_text[2] = np.char.encode(as_text[2], "utf-8")
    string_losses = train(tmp_path / "string", text_model(), as_text)
    float_losses = train(tmp_path / "float", text_model(TensorProto.FLOAT), list(FEATURES))
    assert string_losses == float_losses
    assert string_losses[-1] < string_losses[0]


def test_string_inputs_that_do_not_parse_or_are_not_cast_are_refused(tmp_path: Path) -> None:
    generate_artifacts(text_model(), requires_grad=["fc.weight"], loss=LossType.MSELoss, artifact_directory=tmp_path)
    module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
    bad = np.array([["1.5", "two", "3"]] * 4)
    with pytest.raises(InputTypeError, match="input 'text'.*float32.*two"):
        module(bad, TARGETS[0])
    with pytest.raises(UnsupportedOperatorError, match="string input 'text' is read by Identity"):
        numeric_inputs(text_model(reader="Identity").graph)


ORT_SCRIPT = """
import json, sys
import numpy as np, onnx
from onnxruntime.training import artifacts
from onnxruntime.training.api import CheckpointState, Module, Optimizer
base, directory, data = sys.argv[1:4]
import os; os.makedirs(directory, exist_ok=True)
artifacts.generate_artifacts(onnx.load(base), requires_grad=["fc.weight", "fc.bias"],
                             loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.AdamW,
                             artifact_directory=directory)
module = Module(f"{directory}/training_model.onnx", CheckpointState.load_checkpoint(f"{directory}/checkpoint"),
                f"{directory}/eval_model.onnx")
optimizer = Optimizer(f"{directory}/optimizer_model.onnx", module)
texts, targets = np.load(f"{data}/texts.npy"), np.load(f"{data}/targets.npy")
losses = []
for text, target in zip(texts, targets):
    losses.append(float(module(text, target)))
    optimizer.step()
    module.lazy_reset_grad()
module.eval()
losses.append(float(module(texts[0], targets[0])))
print(json.dumps(losses))
"""


@requires_ort[0]
@requires_ort[1]
def test_string_input_training_matches_onnxruntime(tmp_path: Path) -> None:
    texts = np.array([[[repr(float(v)) for v in row] for row in batch] for batch in FEATURES])
    np.save(tmp_path / "texts.npy", texts)
    np.save(tmp_path / "targets.npy", TARGETS)
    onnx.save(text_model(), tmp_path / "base.onnx")
    expected = run_ort(ORT_SCRIPT, tmp_path / "base.onnx", tmp_path / "ort", tmp_path)
    np.testing.assert_allclose(train(tmp_path / "ours", text_model(), list(texts)), expected, rtol=1e-5, atol=1e-6)
