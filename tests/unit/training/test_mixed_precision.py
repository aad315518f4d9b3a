"""Module(mixed_precision=...): autocast curves against float32, fp16 loss scaling, skipped steps, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from ort_torch_train.optim.schedulers import linear_with_warmup
from ort_torch_train.state.loss_scale import GROWTH_TRACKER_PROPERTY, LOSS_SCALE_PROPERTY
from tests.helpers.corpus import Case, loss_of
from tests.helpers.paths import FIXTURES

CURVE_FIXTURES = ("mlp_ce_adamw_sched", "cnn", "transformer")
STEPS = 50


def _run(case: Case, mixed_precision, steps: int, state=None, *, start: int = 0, compile=False):
    state = state or case.load_state()
    module = Module(case.artifact("training_model.onnx"), state, mixed_precision=mixed_precision, compile=compile)
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    losses = [loss_of(module.step(optimizer, *case.train_inputs((start + s) % case.steps))) for s in range(steps)]
    return module, optimizer, losses


def _snapshot(module: Module) -> dict[str, np.ndarray]:
    state = module.training_state
    values = {name: p.detach().numpy().copy() for name, p in state.params.items()}
    for name, moments in state.optimizer.momentums.items():
        values.update({f"{name}/{key}": m.numpy().copy() for key, m in moments.items()})
    return values


@pytest.fixture(scope="session")
def float32_curves() -> dict[str, list[float]]:
    return {name: _run(Case(FIXTURES / name), None, STEPS)[2] for name in CURVE_FIXTURES}


@pytest.mark.parametrize("mixed_precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", CURVE_FIXTURES)
def test_curve_within_two_percent_of_float32(float32_curves, name, mixed_precision):
    module, optimizer, losses = _run(Case(FIXTURES / name), mixed_precision, STEPS)
    reference = float32_curves[name]
    assert abs(losses[-1] - reference[-1]) <= 0.02 * abs(reference[-1]), (losses[-1], reference[-1])
    assert losses != reference  # autocast really ran in low precision
    assert all(p.dtype == torch.float32 for p in module.training_state.params.values())  # master weights
    assert all(
        m.dtype == torch.float32 for ms in module.training_state.optimizer.momentums.values() for m in ms.values()
    )
    assert optimizer.skipped_steps == 0 and optimizer._engine.completed_steps == STEPS


def _overflow_step(case: Case, module: Module, optimizer: Optimizer, step: int):
    inputs = case.train_inputs(step)
    inputs[0] = inputs[0] * np.float32(1e6)  # fp16 activations overflow
    return module.step(optimizer, *inputs)


def test_injected_overflow_skips_exactly_that_step():
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    module, optimizer, _ = _run(case, "fp16", 3)
    assert not optimizer.last_step_skipped and optimizer.get_learning_rate() > 0
    before, steps_before = _snapshot(module), optimizer._engine.completed_steps
    scale_before = module.precision.loss_scaler.get_scale()
    assert scale_before == 2.0**16
    _overflow_step(case, module, optimizer, 3)
    assert optimizer.last_step_skipped and optimizer.skipped_steps == 1
    assert module.precision.loss_scaler.get_scale() == scale_before / 2
    assert optimizer._engine.completed_steps == steps_before
    after = _snapshot(module)
    for key, value in before.items():
        assert after[key].tobytes() == value.tobytes(), key
    module.step(optimizer, *case.train_inputs(4))
    assert not optimizer.last_step_skipped and optimizer.skipped_steps == 1
    assert optimizer._engine.completed_steps == steps_before + 1


def test_skipped_step_leaves_the_lr_schedule_alone():
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    module = Module(case.artifact("training_model.onnx"), case.load_state(), mixed_precision="fp16")
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    scheduler = LinearLRScheduler(optimizer, 2, 10, 0.01)
    rates = []
    for step in range(5):
        if step == 3:
            _overflow_step(case, module, optimizer, step)
            assert optimizer.last_step_skipped
        else:
            module.step(optimizer, *case.train_inputs(step))
        scheduler.step()
        rates.append(optimizer.get_learning_rate())
    clean = [linear_with_warmup(count, 2, 10) * 0.01 for count in (1, 2, 3, 3, 4)]  # step 3 did not count
    np.testing.assert_allclose(rates, clean, rtol=1e-6)


def test_checkpoint_mid_run_resumes_bit_exactly(tmp_path):
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    module, optimizer, _ = _run(case, "fp16", 4)
    _overflow_step(case, module, optimizer, 4)  # the scale moves away from its initial value
    module.step(optimizer, *case.train_inputs(5))
    path = tmp_path / "mid.ckpt"
    CheckpointState.save_checkpoint(module.checkpoint_state, path, include_optimizer_state=True)
    continued = [loss_of(module.step(optimizer, *case.train_inputs(s % case.steps))) for s in range(6, 16)]
    restored = CheckpointState.load_checkpoint(path)
    assert restored.properties[LOSS_SCALE_PROPERTY] == 2.0**15
    assert restored.properties[GROWTH_TRACKER_PROPERTY] == 1
    resumed_module, resumed_optimizer, resumed = _run(case, "fp16", 10, restored, start=6)
    assert resumed == continued  # bit-exact
    assert _snapshot(resumed_module).keys() == _snapshot(module).keys()
    for key, value in _snapshot(module).items():
        assert _snapshot(resumed_module)[key].tobytes() == value.tobytes(), key
    assert resumed_module.precision.loss_scaler.get_scale() == module.precision.loss_scaler.get_scale()


def test_scale_grows_after_growth_interval_clean_steps():
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    module, optimizer, _ = _run(case, "fp16", 1)
    scaler = module.precision.loss_scaler
    scaler.growth_interval = 3
    for s in range(1, 4):
        module.step(optimizer, *case.train_inputs(s))
    assert optimizer.skipped_steps == 0
    assert scaler.get_scale() == 2.0**17  # 1 + 3 clean steps: grew once at the third with interval 3
    assert module.training_state.properties[GROWTH_TRACKER_PROPERTY] == 1


def test_bf16_eval_and_bad_setting():
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    module = Module(
        case.artifact("training_model.onnx"),
        case.load_state(),
        case.artifact("eval_model.onnx"),
        mixed_precision="bf16",
    )
    assert module.precision.loss_scaler is None
    module.eval()
    outputs = module(*case.eval_inputs())
    assert outputs[0].dtype == np.float32 if isinstance(outputs, list) else outputs.dtype == np.float32
    with pytest.raises(ValueError, match="mixed_precision"):
        Module(case.artifact("training_model.onnx"), case.load_state(), mixed_precision="fp8")


@pytest.mark.compile
def test_compiled_fp16_step_scales_and_skips():
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    _, _, eager = _run(case, "fp16", 4)
    module, optimizer, compiled = _run(case, "fp16", 4, compile=True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-3)
    before = _snapshot(module)
    _overflow_step(case, module, optimizer, 4)
    assert optimizer.last_step_skipped and module.precision.loss_scaler.get_scale() == 2.0**15
    for key, value in _snapshot(module).items():
        assert value.tobytes() == before[key].tobytes(), key
