"""OptimizerEngine over a TrainingState, and with the Module against ORT's recorded runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ort_torch_train.api.optimizer import (
    LinearLRScheduler,
    Optimizer,
)
from ort_torch_train.errors import CheckpointError, NominalStateError
from ort_torch_train.optim.adamw import ADAMW_ALGORITHM, AdamWHyperparameters, adamw
from ort_torch_train.optim.engine import DEFAULT_LEARNING_RATE, OptimizerEngine
from ort_torch_train.optim.optimizer_model import OptimizerSpec, read_optimizer_model
from ort_torch_train.optim.sgd import SGD_ALGORITHM
from ort_torch_train.state.training_state import OptimizerState, TrainingState
from tests.helpers.optimizer_models import F32, NAMES, make_state, optimizer_model, set_grads
from tests.helpers.paths import REFCORPUS

HF_ADAMW = OptimizerSpec(
    ADAMW_ALGORITHM,
    AdamWHyperparameters(
        lr=DEFAULT_LEARNING_RATE,
        beta1=F32(0.9),
        beta2=F32(0.999),
        eps=F32(1e-6),
        weight_decay=0.0,
        adam_mode=1,
        correct_bias=True,
    ),
)
SGD = OptimizerSpec(SGD_ALGORITHM, SGD_ALGORITHM.hyperparameters())


# ---- engine ---------------------------------------------------------------------------------------
def test_engine_creates_zero_moments_in_the_state():
    state = make_state()
    engine = OptimizerEngine(HF_ADAMW, state, NAMES)
    assert state.optimizer == OptimizerState("group0", 0, F32(0.001), state.optimizer.momentums)
    assert sorted(state.optimizer.momentums) == sorted(NAMES)  # frozen params get none
    for name in NAMES:
        moments = state.optimizer.momentums[name]
        assert sorted(moments) == ["momentum0", "momentum1"]
        assert all(torch.equal(m, torch.zeros_like(state.params[name])) for m in moments.values())
    assert engine.learning_rate == F32(0.001) == DEFAULT_LEARNING_RATE
    sgd_state = make_state()
    OptimizerEngine(SGD, sgd_state, NAMES)
    assert all(list(m) == ["momentum0"] for m in sgd_state.optimizer.momentums.values())


def test_engine_steps_like_the_kernel_with_step_plus_one():
    state, reference = make_state(), make_state()
    engine = OptimizerEngine(HF_ADAMW, state, NAMES, implementation="foreach")
    ref_params = [reference.params[n].detach() for n in NAMES]
    ref_m = [torch.zeros_like(p) for p in ref_params]
    ref_v = [torch.zeros_like(p) for p in ref_params]
    engine.set_learning_rate(0.01)
    for step in range(1, 4):
        set_grads(state, step)
        set_grads(reference, step)
        assert engine.step() is True
        adamw(
            ref_params,
            [reference.params[n].grad for n in NAMES],
            ref_m,
            ref_v,
            AdamWHyperparameters(
                lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0, adam_mode=1, correct_bias=True
            ),
            step=step,
            implementation="foreach",
        )
        assert state.optimizer.step == engine.completed_steps == step
    for name, expected, m in zip(NAMES, ref_params, ref_m):
        assert torch.equal(state.params[name].detach(), expected)
        assert torch.equal(state.optimizer.momentums[name]["momentum0"], m)
    assert state.params["frozen.weight"].grad is None


def _train(state, steps, start=0, implementation=None):
    engine = OptimizerEngine(HF_ADAMW, state, NAMES, implementation=implementation)
    engine.set_learning_rate(0.01)
    for step in range(start, start + steps):
        set_grads(state, step)
        engine.step()


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
def test_resume_from_a_saved_checkpoint_is_bit_exact(implementation):
    continuous = make_state()
    _train(continuous, 6, implementation=implementation)
    first = make_state()
    _train(first, 3, implementation=implementation)
    resumed = TrainingState.load(first.to_bytes(include_optimizer_state=True))
    assert resumed.optimizer.step == 3
    _train(resumed, 3, start=3, implementation=implementation)
    for name in NAMES:
        assert torch.equal(resumed.params[name], continuous.params[name])
        assert torch.equal(
            resumed.optimizer.momentums[name]["momentum1"], continuous.optimizer.momentums[name]["momentum1"]
        )


def test_default_implementation():
    assert OptimizerEngine(HF_ADAMW, make_state(), NAMES)._kernel.implementation == "fused"
    no_bias_correction = OptimizerSpec(
        ADAMW_ALGORITHM, ADAMW_ALGORITHM.hyperparameters(dict(adam_mode=1, correct_bias=0))
    )
    assert OptimizerEngine(no_bias_correction, make_state(), NAMES)._kernel.implementation == "fused"
    assert OptimizerEngine(SGD, make_state(), NAMES)._kernel.implementation == "foreach"
    foreach = OptimizerEngine(HF_ADAMW, make_state(), NAMES, implementation="foreach")
    assert (
        len(foreach._kernel.scratch) == 2
        and foreach._kernel.scratch[0][0].shape == foreach.tensor_lists().params[0].shape
    )


def test_engine_rejects_moments_that_do_not_fit():
    state = make_state()
    OptimizerEngine(SGD, state, NAMES)  # SGD leaves momentum0 only
    with pytest.raises(CheckpointError, match="lacks 'momentum1'"):
        OptimizerEngine(HF_ADAMW, state, NAMES)
    state.optimizer.momentums["fc1.bias"]["momentum0"] = torch.zeros(3)
    with pytest.raises(CheckpointError, match=r"'fc1.bias'/'momentum0' is torch.float32 of shape \(3,\)"):
        OptimizerEngine(SGD, state, NAMES)
    del state.optimizer.momentums["fc1.bias"]
    with pytest.raises(CheckpointError, match="Parameter fc1.bias not found"):
        OptimizerEngine(SGD, state, NAMES)
    state.optimizer.group_name = "group1"
    with pytest.raises(CheckpointError, match="'group1'"):
        OptimizerEngine(SGD, state, NAMES)


def test_engine_rejects_bad_parameter_names():
    with pytest.raises(ValueError, match="no trainable parameters"):
        OptimizerEngine(HF_ADAMW, make_state(), [])
    with pytest.raises(ValueError, match="unique"):
        OptimizerEngine(HF_ADAMW, make_state(), ["fc1.bias", "fc1.bias"])
    with pytest.raises(KeyError, match="'nope' is not in the training state"):
        OptimizerEngine(HF_ADAMW, make_state(), ["nope"])
    with pytest.raises(ValueError, match="does not require grad"):
        OptimizerEngine(HF_ADAMW, make_state(), ["frozen.weight"])
    with pytest.raises(ValueError, match="implementation for adamw must be one of"):
        OptimizerEngine(HF_ADAMW, make_state(), NAMES, implementation="magic")
    with pytest.raises(ValueError, match="implementation for sgd must be one of"):
        OptimizerEngine(SGD, make_state(), NAMES, implementation="fused")


def test_learning_rate_is_float32_and_validated():
    engine = OptimizerEngine(HF_ADAMW, make_state(), NAMES)
    engine.set_learning_rate(0.1)
    assert engine.learning_rate == F32(0.1) != 0.1
    for bad in (float("nan"), -1.0, float("inf"), 1e39):
        with pytest.raises(ValueError, match="learning rate must"):
            engine.set_learning_rate(bad)
    with pytest.raises(TypeError, match="real number"):
        engine.set_learning_rate("0.1")
    assert engine.learning_rate == F32(0.1)


def test_clip_scales_the_accumulated_gradients_in_place():
    state = make_state()
    engine = OptimizerEngine(read_optimizer_model(optimizer_model("sgd", clip=0.5)), state, NAMES)
    set_grads(state, 0)
    grads = [state.params[n].grad for n in NAMES]
    engine.step()
    assert state.params[NAMES[0]].grad is grads[0]
    total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    assert total == pytest.approx(0.5, rel=1e-5)


def test_update_signal_skips_the_update_and_the_count():
    state = make_state()
    engine = OptimizerEngine(read_optimizer_model(optimizer_model("adamw", signal=True, adam_mode=1)), state, NAMES)
    set_grads(state, 0)
    before = {n: state.params[n].detach().clone() for n in NAMES}
    assert engine.step(update_signal=False) is False
    assert state.optimizer.step == 0 and all(torch.equal(state.params[n], before[n]) for n in NAMES)
    assert engine.step() is True and state.optimizer.step == 1
    with pytest.raises(ValueError, match="no update-signal input|has none"):
        OptimizerEngine(HF_ADAMW, make_state(), NAMES).step(update_signal=False)


def test_nominal_state_gets_its_moments_at_the_first_step():
    loaded = make_state()
    nominal = TrainingState(
        {n: torch.nn.Parameter(torch.empty(0), requires_grad=p.requires_grad) for n, p in loaded.params.items()},
        is_nominal=True,
    )
    engine = OptimizerEngine(HF_ADAMW, nominal, NAMES)
    with pytest.raises(NominalStateError, match="nominal state"):
        engine.step()
    nominal.complete_nominal({n: p.detach() for n, p in loaded.params.items()})
    engine.step()
    assert nominal.optimizer.step == 1 and sorted(nominal.optimizer.momentums) == sorted(NAMES)


# ---- with the Module, against ORT's recorded runs -------------------------------------------------


def _refcorpus_run(model: str, schedule: bool, implementation: str | None):
    module_api = pytest.importorskip("ort_torch_train.api.module")
    root = REFCORPUS / model
    expected = json.loads((root / "expected.json").read_text())
    data = np.load(root / "data.npz")
    state = TrainingState.load(root / "artifacts" / "checkpoint")
    module = module_api.Module(str(root / "artifacts" / "training_model.onnx"), state)
    optimizer = Optimizer(root / "artifacts" / "optimizer_model.onnx", module)
    if implementation is not None:
        optimizer._engine = OptimizerEngine(
            optimizer._engine.spec, state, module.trainable_parameter_names, implementation=implementation
        )
    # mlp's LinearLRScheduler(opt, 3, 20, 0.01) ran as warmup=20, total=3 in ORT (swapped binding); for
    # steps 0..20 that is the same schedule as warmup=20, total=20.
    scheduler = LinearLRScheduler(optimizer, 20, 20, 0.01) if schedule else None
    lrs, losses = [], []
    for i in range(20):
        if scheduler is None:
            optimizer.set_learning_rate(expected["train"]["lr_before_each_step"][i])
        lrs.append(optimizer.get_learning_rate())
        losses.append(float(module(data["x_train"][i], data["y_train"][i])))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        module.lazy_reset_grad()
    return expected, np.load(root / "arrays.npz"), state, lrs, losses


@pytest.mark.skipif(not REFCORPUS.is_dir(), reason="refcorpus not available")
@pytest.mark.parametrize(
    "model,schedule,implementation",
    [
        ("mlp", True, None),
        ("mlp", True, "foreach"),
        ("mlp_frozen", False, None),
        ("cnn", False, None),
        ("bce", False, None),
        ("regress_mse", False, None),
    ],
)
def test_training_matches_ort_recorded_run(model, schedule, implementation):
    expected, arrays, state, lrs, losses = _refcorpus_run(model, schedule, implementation)
    assert lrs == [F32(x) for x in expected["train"]["lr_before_each_step"]]
    np.testing.assert_allclose(losses, expected["train"]["losses"], rtol=0, atol=5e-6)
    assert state.optimizer.step == 20
    for name, param in state.params.items():
        np.testing.assert_allclose(param.detach().numpy(), arrays[f"final__{name}"], rtol=0, atol=5e-7)
    for name, moments in state.optimizer.momentums.items():
        for key, moment in moments.items():
            np.testing.assert_allclose(moment.numpy(), arrays[f"optim_state__group0__{name}__{key}"], rtol=0, atol=1e-6)
