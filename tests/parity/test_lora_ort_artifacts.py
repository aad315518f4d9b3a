"""LoRA on artifacts made by onnxruntime-training 1.19.2 (the transformer fixture): Module(lora=) trains the
adapters only, the checkpoint loads in ORT 1.19.2, and ORT's own run of the merged export gives our eval loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.lora import LoraConfig
from tests.helpers.corpus import Case, loss_of
from tests.helpers.ort_peer import requires_ort, run_ort
from tests.helpers.paths import FIXTURES

CASE = Case(FIXTURES / "transformer")
TARGETS = ["*in_proj_weight", "*out_proj.weight", "*linear1.weight", "*linear2.weight"]
STEPS = 5


def lora_module(state: CheckpointState, **config) -> Module:
    return Module(
        CASE.artifact("training_model.onnx"),
        state,
        CASE.artifact("eval_model.onnx"),
        lora=LoraConfig(r=4, alpha=8, targets=TARGETS, **config),
    )


def train(module: Module, steps: int = STEPS) -> list[float]:
    optimizer = Optimizer(CASE.artifact("optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.01)
    losses = []
    for step in range(steps):
        losses.append(loss_of(module(*CASE.train_inputs(step))))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def test_module_lora_trains_the_adapters_only() -> None:
    state = CASE.load_state()
    before = {name: param.detach().clone() for name, param in state.training_state.params.items()}
    module = lora_module(state)
    names = module.trainable_parameter_names
    assert len(names) == 2 * len(TARGETS) and all("lora_" in name for name in names)
    assert sorted(state.training_state.frozen_names()) == sorted(before)
    assert all(state.training_state.params[name].grad is None for name in before)
    losses = train(module)
    assert losses[0] == pytest.approx(CASE.expected["train"]["losses"][0], abs=1e-5)  # B = 0: the base model
    assert losses[-1] < losses[0]
    for name, value in before.items():
        assert torch.equal(state.training_state.params[name], value), name  # bitwise unchanged
    assert all(state.training_state.params[name].abs().sum() > 0 for name in names)
    assert sorted(state.training_state.optimizer.momentums if state.training_state.optimizer else names) == sorted(
        names
    )


def test_frozen_dtype_holds_the_base_in_bfloat16() -> None:
    state = CASE.load_state()
    module = lora_module(state, frozen_dtype=torch.bfloat16)
    params = state.training_state.params
    assert {params[name].dtype for name in state.training_state.frozen_names()} == {torch.bfloat16}
    assert {params[name].dtype for name in module.trainable_parameter_names} == {torch.float32}
    losses = train(module, 3)
    assert losses[0] == pytest.approx(CASE.expected["train"]["losses"][0], abs=2e-2)
    assert np.isfinite(losses).all()


ORT_EVAL = """
import json, sys
import numpy as np
import onnxruntime as ort
from onnxruntime.training.api import CheckpointState
state = CheckpointState.load_checkpoint(sys.argv[1])
params = {name: [list(p.data.shape), bool(p.requires_grad)] for name, p in state.parameters}
session = ort.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
data = np.load(sys.argv[3])
feeds = {value.name: data[key] for value, key in zip(session.get_inputs(), json.loads(sys.argv[4]))}
print(json.dumps({"params": params, "loss": float(session.run(None, feeds)[0])}))
"""


@pytest.mark.slow
@requires_ort[0]
@requires_ort[1]
def test_lora_checkpoint_and_merged_export_in_ort(tmp_path) -> None:
    state = CASE.load_state()
    module = lora_module(state)
    train(module)
    module.eval()
    eval_loss = loss_of(module(*CASE.eval_inputs()))
    CheckpointState.save_checkpoint(state, tmp_path / "checkpoint", include_optimizer_state=True)
    module.export_model_for_inferencing(tmp_path / "merged.onnx", module.output_names(False))
    keys = CASE.expected.get("data_keys", {}).get("eval") or ["x_eval", "y_eval"]
    result = run_ort(
        ORT_EVAL, tmp_path / "checkpoint", tmp_path / "merged.onnx", CASE.root / "data.npz", json.dumps(keys)
    )
    params = state.training_state.params
    assert result["params"] == {name: [list(p.shape), p.requires_grad] for name, p in params.items()}
    assert result["loss"] == pytest.approx(eval_loss, abs=1e-5)


def test_lora_drops_the_base_moments_of_an_ort_checkpoint() -> None:
    state = CheckpointState.load_checkpoint(CASE.root / "final_checkpoint_with_optimizer")
    assert state.training_state.optimizer is not None and state.training_state.optimizer.momentums
    module = lora_module(state)
    assert not state.training_state.optimizer.momentums  # the frozen base keeps no moments
    train(module, 1)
    assert sorted(state.training_state.optimizer.momentums) == sorted(module.trainable_parameter_names)
