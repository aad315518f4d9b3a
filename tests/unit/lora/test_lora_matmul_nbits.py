"""LoRA on a com.microsoft MatMulNBits weight: adapters K x r and r x N named as the builder names a float
weight's, the packed weight frozen and packed in the state, merging refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.errors import ModelError
from ort_torch_train.lora import LoraConfig

K, N, BLOCK = 32, 8, 32
WEIGHT = "model.layers.0.mlp.down_proj.MatMul.weight_Q4"


def nbits_model() -> onnx.ModelProto:
    generator = np.random.default_rng(0)
    packed = generator.integers(0, 256, (N, 1, BLOCK // 2), dtype=np.uint8)
    scales = (generator.random(N) * 0.1 + 0.01).astype(np.float32)
    node = helper.make_node(
        "MatMulNBits", ["x", WEIGHT, "scales"], ["y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=BLOCK
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", N])],
        [numpy_helper.from_array(packed, WEIGHT), numpy_helper.from_array(scales, "scales")],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    generate_artifacts(
        nbits_model(),
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        lora=LoraConfig(r=2, alpha=4, targets=["*down_proj*"]),
    )
    return tmp_path


def test_adapters_train_beside_the_packed_weight_which_stays_packed(artifacts: Path) -> None:
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    params = module.training_state.params
    a, b = "model.layers.0.mlp.down_proj.lora_A.MatMul.weight", "model.layers.0.mlp.down_proj.lora_B.MatMul.weight"
    assert params[a].shape == (K, 2) and params[b].shape == (2, N) and params[a].requires_grad
    assert params[WEIGHT].dtype == torch.uint8 and not params[WEIGHT].requires_grad
    assert "scales" not in params or not params["scales"].requires_grad  # never a target, never trained
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.05)
    x, target = np.random.default_rng(1).standard_normal((4, K)).astype(np.float32), np.ones((4, N), np.float32)
    losses = [float(module.step(optimizer, x, target)) for _ in range(10)]
    assert losses[-1] < losses[0]
    with pytest.raises(ModelError, match="quantised"):
        module.export_model_for_inferencing(str(artifacts / "merged.onnx"), ["y"])
