"""A weight that generate_artifacts leaves as a graph constant (named in neither requires_grad nor
frozen_params, as a LoRA user's base weights) is held once: the forward graph takes it out of its proto,
and every conversion binds that tensor (``convert/constants.py``); the eval graph binds it too."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts


def _storages(module: nn.Module) -> set[int]:
    return {tensor.untyped_storage().data_ptr() for tensor in module.buffers()}


def test_a_constant_weight_is_bound_once_by_every_conversion(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 4))
    generate_artifacts(
        model,
        requires_grad=["2.weight", "2.bias"],  # the first layer stays a graph constant
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randn(2, 64),),
    )
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((batch, 64), np.float32), rng.standard_normal((batch, 4), np.float32))
        for batch in (2, 3, 2)
    ]
    with torch.no_grad():  # the first step's loss, before any update
        x, y = (torch.from_numpy(a) for a in batches[0])
        expected = float(nn.functional.mse_loss(model(x), y))
    module.train()
    losses = []
    for x, y in batches:  # two input signatures: two conversions of the training graph
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    assert abs(losses[0] - expected) < 1e-6
    module.eval()
    module(*batches[0])
    for graph, conversions in ((module._engine.train_graph, 2), (module._engine.eval_graph, 1)):
        weight = graph.constants["0.weight"]
        assert torch.equal(weight, model[0].weight.detach())
        assert all(init.name != "0.weight" for init in graph.graph.initializer)  # the proto holds no copy
        converted = list(graph._cache.values())
        assert len(converted) == conversions
        for built in converted:
            assert weight.untyped_storage().data_ptr() in _storages(built)  # bound, not copied
    # the eval graph binds the training graph's tensor of the same value
    assert module._engine.eval_graph.constants["0.weight"] is module._engine.train_graph.constants["0.weight"]


def test_an_eval_constant_that_differs_from_the_training_one_is_its_own(tmp_path):
    """A constant of the eval model whose value is not the training model's (same name) is read from the
    eval model: sharing asks for equal dtype, shape and bytes."""
    import onnx

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    generate_artifacts(
        model,
        requires_grad=["2.weight", "2.bias"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randn(2, 8),),
    )
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    (weight,) = [init for init in eval_model.graph.initializer if init.name == "0.weight"]
    changed = onnx.numpy_helper.to_array(weight) * 2
    weight.CopyFrom(onnx.numpy_helper.from_array(changed, "0.weight"))
    onnx.save(eval_model, tmp_path / "eval_changed.onnx")
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_changed.onnx")
    engine = module._engine
    assert engine.eval_graph.constants["0.weight"] is not engine.train_graph.constants["0.weight"]
    np.testing.assert_array_equal(engine.eval_graph.constants["0.weight"].numpy(), changed)
    assert engine.eval_graph.constants["0.bias"] is engine.train_graph.constants["0.bias"]
