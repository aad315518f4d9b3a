"""Constants the training and eval models both hold (an LLM's embedding and LM head left out of the
parameters) are stored once: in ``training_model.onnx.data``, which the eval model refers to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

VOCAB, HIDDEN = 1024, 64


def weight_heavy_lm() -> onnx.ModelProto:
    """ids -> Gather(embedding) * norm -> MatMul(head) -> logits: 512 KiB of constants, a 256-byte parameter."""
    generator = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(generator.standard_normal((VOCAB, HIDDEN)).astype(np.float32) * 0.1, "embed.weight"),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "norm.weight"),
        numpy_helper.from_array(generator.standard_normal((HIDDEN, VOCAB)).astype(np.float32) * 0.1, "head.weight"),
    ]
    nodes = [
        helper.make_node("Gather", ["embed.weight", "input_ids"], ["embedded"]),
        helper.make_node("Mul", ["embedded", "norm.weight"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "head.weight"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T", VOCAB])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_constants_of_both_models_are_stored_once_and_both_models_load(tmp_path: Path) -> None:
    base = weight_heavy_lm()
    generate_artifacts(
        base,
        requires_grad=["norm.weight"],
        loss=LossType.LanguageModelLoss,
        optimizer=OptimType.AdamW,
        additional_output_names=["logits"],
        artifact_directory=tmp_path,
    )
    files = {path.name: path.stat().st_size for path in tmp_path.iterdir()}
    assert sorted(files) == [
        "checkpoint",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "training_model.onnx",
        "training_model.onnx.data",
    ]
    assert sum(files.values()) <= 1.1 * base.ByteSize()  # was about 2x: the embedding and head in both models
    evaluation = onnx.load(str(tmp_path / "eval_model.onnx"), load_external_data=False)
    locations = {
        init.name: {entry.key: entry.value for entry in init.external_data}["location"]
        for init in evaluation.graph.initializer
        if init.data_location == TensorProto.EXTERNAL
    }
    assert locations == {"embed.weight": "training_model.onnx.data", "head.weight": "training_model.onnx.data"}

    module = Module(
        tmp_path / "training_model.onnx",
        CheckpointState.load_checkpoint(tmp_path / "checkpoint"),
        tmp_path / "eval_model.onnx",
    )
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 8)).astype(np.int64)
    module.train()
    losses = [float(module.step(optimizer, ids, ids)[0]) for _ in range(3)]
    assert losses[-1] < losses[0], losses
    module.eval()
    loss, logits = module(ids, ids)
    weights = {init.name: torch.from_numpy(numpy_helper.to_array(init).copy()) for init in base.graph.initializer}
    norm = torch.from_numpy(module.get_contiguous_parameters().numpy()).reshape(HIDDEN)  # the one parameter
    expected = (weights["embed.weight"][torch.from_numpy(ids)] * norm) @ weights["head.weight"]
    np.testing.assert_allclose(logits, expected.numpy(), rtol=1e-5, atol=1e-5)
    session = onnxruntime.InferenceSession(str(tmp_path / "eval_model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "labels": ids, "norm.weight": norm.numpy()}
    np.testing.assert_allclose(session.run(None, feeds)[1], expected.numpy(), rtol=1e-5, atol=1e-5)
