"""Legacy TrainingSession: use_mixed_precision with loss_scale (dynamic / static) and use_fp16_moments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.legacy_models import WEIGHTS, batches, lrs, params_for, session, train

STEPS = 20


@pytest.mark.parametrize("optimizer", ["AdamOptimizer", "LambOptimizer"])
def test_fp16_moments_within_1e_3_of_float32_moments_after_20_steps(optimizer):
    data, rates = batches(STEPS), lrs(STEPS)
    full = session(params_for(optimizer))
    half = session(params_for(optimizer, use_fp16_moments=True))
    np.testing.assert_allclose(train(half, data, rates), train(full, data, rates), rtol=0, atol=1e-3)
    full_state, half_state = full.get_state(), half.get_state()
    for n in WEIGHTS:
        assert half_state[f"Moment_1_{n}"].dtype == np.float16
        np.testing.assert_allclose(
            half_state[n], full_state[n], rtol=0, atol=5e-3
        )  # v's fp16 rounding, 20 steps at lr 0.05
        for moment in ("Moment_1", "Moment_2"):
            np.testing.assert_allclose(
                half_state[f"{moment}_{n}"].astype(np.float32), full_state[f"{moment}_{n}"], rtol=0, atol=1e-3
            )


@pytest.mark.parametrize("loss_scale", [0.0, 1024.0])
def test_mixed_precision_follows_the_float32_run_and_skips_overflows(loss_scale):
    data, rates = batches(STEPS), lrs(STEPS)
    reference = train(session(params_for()), data, rates)
    sess = session(params_for(use_mixed_precision=True, loss_scale=loss_scale))
    losses = train(sess, data, rates)
    np.testing.assert_allclose(losses, reference, rtol=0.02)
    scaler = sess._loss_scaler
    assert scaler.get_scale() == (2.0**16 if loss_scale == 0 else loss_scale)
    before = {k: v.copy() for k, v in sess.get_state().items()}
    x, y = data[0]
    train(sess, [(x * np.float32(1e6), y)], rates[:1])  # fp16 activations overflow: the update is skipped
    after = sess.get_state()
    for name, value in before.items():
        assert after[name].tobytes() == value.tobytes(), name
    assert scaler.get_scale() == (2.0**15 if loss_scale == 0 else loss_scale)  # static: never changes
    assert sess.training_state.params[WEIGHTS[0]].dtype == torch.float32


def test_negative_loss_scale_is_refused():
    with pytest.raises(ValueError, match="loss_scale"):
        session(params_for(use_mixed_precision=True, loss_scale=-1.0))
