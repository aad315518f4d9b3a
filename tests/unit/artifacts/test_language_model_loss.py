"""LanguageModelLoss (cross-entropy over [B, T, V] logits, [B, T] labels, ignore_index, shift) and the
loss inputs of a model with present key/value outputs."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.artifacts import LanguageModelLoss, LossType, generate_artifacts
from ort_torch_train.errors import ModelError

VOCAB, HIDDEN = 11, 6


def lm_model(extra_outputs: tuple[str, ...] = ("present.0.key",)) -> onnx.ModelProto:
    """ids [B, T] -> Gather(embedding) -> MatMul(head) -> logits [B, T, V], plus copies named like a KV cache."""
    generator = np.random.default_rng(0)
    embedding = numpy_helper.from_array(generator.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "embed.weight")
    head = numpy_helper.from_array(generator.standard_normal((HIDDEN, VOCAB)).astype(np.float32), "head.weight")
    nodes = [
        helper.make_node("Gather", ["embed.weight", "input_ids"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "head.weight"], ["logits"]),
    ]
    nodes += [helper.make_node("Identity", ["hidden"], [name]) for name in extra_outputs]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T", VOCAB])]
    outputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", "T", HIDDEN]) for name in extra_outputs]
    graph = helper.make_graph(
        nodes,
        "lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"])],
        outputs,
        [embedding, head],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shift", [True, False])
def test_language_model_loss_matches_torch_cross_entropy_with_ignored_labels(tmp_path: Path, shift: bool) -> None:
    generate_artifacts(
        lm_model(),
        requires_grad=["head.weight"],
        loss=LanguageModelLoss(shift=shift),
        artifact_directory=tmp_path,
    )
    module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 5)).astype(np.int64)
    labels = ids.copy()
    labels[0, 3] = labels[1, 1] = -100
    loss = module(ids, labels)
    model = lm_model()
    weights = {init.name: torch.from_numpy(numpy_helper.to_array(init)) for init in model.graph.initializer}
    logits = weights["embed.weight"][torch.from_numpy(ids)] @ weights["head.weight"]
    target = torch.from_numpy(labels)
    if shift:
        logits, target = logits[:, :-1], target[:, 1:]
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=-100)
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)


def test_loss_reads_the_output_that_is_not_a_kv_cache_by_default(tmp_path: Path) -> None:
    generate_artifacts(
        lm_model(), requires_grad=["head.weight"], loss=LossType.LanguageModelLoss, artifact_directory=tmp_path
    )
    training = onnx.load(tmp_path / "training_model.onnx")
    (labels,) = [value for value in training.graph.input if value.name == "labels"]
    assert [dim.dim_param or dim.dim_value for dim in labels.type.tensor_type.shape.dim] == ["B", "T"]


def test_several_outputs_beside_the_kv_cache_name_loss_input_names(tmp_path: Path) -> None:
    model = lm_model(("present.0.key", "hidden_states"))
    with pytest.raises(ModelError, match="loss_input_names"):
        generate_artifacts(
            model, requires_grad=["head.weight"], loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path
        )


def test_a_constant_declared_as_a_scalar_gets_its_shape_without_a_warning(tmp_path: Path) -> None:
    model = lm_model()
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])  # declared as a scalar, as the builder does
    model.graph.node.insert(0, helper.make_node("Constant", [], ["one_value"], value=one))
    model.graph.value_info.append(helper.make_tensor_value_info("one_value", TensorProto.INT64, []))
    model.graph.node.append(helper.make_node("Identity", ["one_value"], ["one_out"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate_artifacts(
            model, requires_grad=["head.weight"], loss=LossType.LanguageModelLoss, artifact_directory=tmp_path
        )
    (declared,) = [v for v in onnx.load(tmp_path / "eval_model.onnx").graph.value_info if v.name == "one_value"]
    assert [dim.dim_value for dim in declared.type.tensor_type.shape.dim] == [1]


def test_a_rank_that_onnxruntime_accepts_is_a_warning(tmp_path: Path) -> None:
    model = lm_model()
    model.graph.initializer.append(helper.make_tensor("one", TensorProto.INT64, [1], [1]))
    model.graph.node.append(helper.make_node("Identity", ["one"], ["one_value"]))  # declared as a scalar
    model.graph.value_info.append(helper.make_tensor_value_info("one_value", TensorProto.INT64, []))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate_artifacts(
            model, requires_grad=["head.weight"], loss=LossType.LanguageModelLoss, artifact_directory=tmp_path
        )
    assert any("ranks differ" in str(w.message) for w in caught)


def test_cross_entropy_on_language_model_logits_is_refused_naming_language_model_loss(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"'logits' have shape \['B', 'T', 11\].*LossType.LanguageModelLoss"):
        generate_artifacts(
            lm_model(), requires_grad=["head.weight"], loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path
        )
    assert not any(tmp_path.iterdir())  # refused before any file is written
