"""The legacy TrainingSession trains like the Module path and like the legacy formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ort_torch_train.errors import (
    InputError,
    InputTypeError,
)
from ort_torch_train.legacy import RunOptions
from tests.helpers.legacy_models import (
    F32,
    LR,
    WEIGHTS,
    batches,
    initial,
    lrs,
    module_losses,
    optimizer_artifact,
    params_for,
    session,
    train,
)


def test_sgd_matches_the_module_path():
    data, rates = batches(6), lrs(6)
    sess = session(params_for("SGDOptimizer"))
    losses = train(sess, data, rates)
    expected, weights = module_losses(optimizer_artifact("SGDOptimizerV2"), data, rates)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-6)
    for name, value in sess.get_model_state()["full_precision"].items():
        np.testing.assert_allclose(value, weights[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", [0, 1])
def test_adam_matches_the_module_path(mode):
    data, rates = batches(8), lrs(8)
    floats = {"alpha": 0.9, "beta": 0.999, "lambda": 0.01, "epsilon": 1e-6}
    sess = session(params_for(floats=floats, ints={"weight_decay_mode": mode}, enable_grad_norm_clip=False))
    losses = train(sess, data, rates)
    adamw = optimizer_artifact(
        "AdamWOptimizer", alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=0.01, adam_mode=mode, correct_bias=1
    )
    expected, weights = module_losses(adamw, data, rates)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-6)
    for name, value in sess.get_model_state()["full_precision"].items():
        np.testing.assert_allclose(value, weights[name], rtol=0, atol=1e-6)


# ---- a float64 re-implementation of the legacy formulas -----------------------------------------------
def reference_run(data, rates, floats: dict[str, dict], ints: dict[str, dict], steps: int, clip: bool):
    """Forward, backward, accumulation (mean of `steps` gradients), global-norm clipping and ORT's
    legacy AdamOptimizer formulas, all in float64."""
    w = {n: torch.tensor(initial(n), dtype=torch.float64) for n in WEIGHTS}
    m = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    v = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    acc = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    count, t, losses = 0, 1, []
    for (x, y), lr in zip(data, rates):
        leaves = {n: w[n].clone().requires_grad_() for n in WEIGHTS}
        h = torch.relu(torch.from_numpy(x).double() @ leaves["fc1.weight"].T + leaves["fc1.bias"])
        logits = h @ leaves["fc2.weight"].T + leaves["fc2.bias"]
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
        grads = torch.autograd.grad(loss, [leaves[n] for n in WEIGHTS])
        losses.append(loss.item())
        for n, g in zip(WEIGHTS, grads):
            acc[n] += g
        count += 1
        if count < steps:
            continue
        g = {n: acc[n] / steps for n in WEIGHTS}
        norm = math.sqrt(sum(float((g[n] ** 2).sum()) for n in WEIGHTS))
        for n in WEIGHTS:
            a = {"alpha": 0.9, "beta": 0.999, "lambda": 0.0, "epsilon": 1e-8, "max_norm_clip": 1.0, **floats[n]}
            a = {k: F32(val) for k, val in a.items()}
            mode, bias = ints[n].get("weight_decay_mode", 0), ints[n].get("do_bias_correction", 1)
            gn = g[n] / (norm / a["max_norm_clip"]) if clip and norm > a["max_norm_clip"] else g[n]
            m[n] = a["alpha"] * m[n] + (1 - a["alpha"]) * gn
            v[n] = a["beta"] * v[n] + (1 - a["beta"]) * gn * gn
            bc1, bc2 = (1 - a["alpha"] ** t, 1 - a["beta"] ** t) if bias else (1.0, 1.0)
            if mode == 0:
                w[n] = w[n] - lr * ((m[n] / bc1) / ((v[n] / bc2).sqrt() + a["epsilon"]) + a["lambda"] * w[n])
            else:
                u = lr * math.sqrt(bc2) / bc1 * m[n] / (v[n].sqrt() + a["epsilon"])
                w[n] = w[n] - u - lr * a["lambda"] * (w[n] - u)
        t += 1
        count = 0
        acc = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    return losses, w, m, v, t


@pytest.mark.parametrize(
    "mode, bias, clip, steps", [(0, 1, False, 1), (1, 1, False, 1), (0, 0, True, 1), (1, 0, True, 2), (0, 1, True, 3)]
)
def test_adam_matches_the_float64_legacy_formulas(mode, bias, clip, steps):
    data, rates = batches(9), lrs(9)
    floats = {n: {"alpha": 0.85, "beta": 0.99, "epsilon": 1e-6, "max_norm_clip": 0.5} for n in WEIGHTS}
    floats["fc1.weight"]["lambda"] = 0.02  # per-weight attributes
    floats["fc2.bias"]["alpha"] = 0.8
    ints = {n: {"weight_decay_mode": mode, "do_bias_correction": bias} for n in WEIGHTS}
    p = params_for(enable_grad_norm_clip=clip, gradient_accumulation_steps=steps)
    p.optimizer_attributes_map, p.optimizer_int_attributes_map = floats, ints
    sess = session(p)
    losses = train(sess, data, rates)
    expected, w, m, v, t = reference_run(data, rates, floats, ints, steps, clip)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-6)
    state = sess.get_state()
    for n in WEIGHTS:
        np.testing.assert_allclose(state[n], w[n].numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(state[f"Moment_1_{n}"], m[n].numpy(), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(state[f"Moment_2_{n}"], v[n].numpy(), rtol=1e-4, atol=1e-9)
        assert state[f"Update_Count_{n}"].tolist() == [t]


# ---- gradient accumulation and the learning-rate feed -----------------------------------------------
def test_gradient_accumulation_updates_every_nth_run_with_the_mean_gradient():
    data = batches(6)
    sess = session(params_for("SGDOptimizer", gradient_accumulation_steps=3))
    before = sess.get_model_state()["full_precision"]
    train(sess, data[:2], [0.1, 0.1])
    assert all(np.array_equal(v, before[k]) for k, v in sess.get_model_state()["full_precision"].items())
    train(sess, data[2:3], [0.1])
    after = sess.get_model_state()["full_precision"]
    assert not np.array_equal(after["fc1.weight"], before["fc1.weight"])
    # SGD on the mean of the three gradients, each taken at the initial weights (lr 0)
    reference = session(params_for("SGDOptimizer"))
    reference_state = reference.training_state
    grads = []
    for x, y in data[:3]:
        reference.run(["loss"], {"x": x, "y": y, LR: np.array([0.0], np.float32)})
        grads.append({n: reference_state.params[n].grad.clone() for n in WEIGHTS})
    for n in WEIGHTS:
        mean = (grads[0][n] + grads[1][n] + grads[2][n]) * F32(1 / 3)
        np.testing.assert_allclose(after[n], initial(n) - np.float32(0.1) * mean.numpy(), rtol=0, atol=1e-6)


def test_accumulation_driven_like_the_ortrainer_gives_the_same_result():
    data = batches(6)
    plain = session(params_for(gradient_accumulation_steps=3))
    plain_losses = train(plain, data, [0.01] * 6)
    driven = session(params_for(gradient_accumulation_steps=3))
    accumulate = RunOptions(only_execute_path_to_fetches=True)
    driven_losses = []
    for step, (x, y) in enumerate(data):
        if (step + 1) % 3:
            loss, flag = driven.run(["loss", "Group_Accumulated_Gradients"], {"x": x, "y": y}, accumulate)
            assert flag.dtype == np.bool_ and bool(flag)
        else:
            (loss,) = driven.run(["loss"], {"x": x, "y": y, LR: np.array([0.01], np.float32)})
        driven_losses.append(float(loss))
    assert driven_losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(plain.get_state().values(), driven.get_state().values()))


def test_learning_rate_feed():
    sess = session(params_for("SGDOptimizer", lr_params_feed_name="lr"))
    x, y = batches(1)[0]
    assert [arg.name for arg in sess.get_inputs()] == ["x", "y", "lr"]
    with pytest.raises(InputError, match="Missing Input: lr"):
        sess.run(["loss"], {"x": x, "y": y})
    with pytest.raises(InputError, match="Invalid Feed Input Name:Learning_Rate"):
        sess.run(["loss"], {"x": x, "y": y, LR: np.array([0.1], np.float32)})
    with pytest.raises(InputTypeError, match=r"Actual: \(tensor\(double\)\), expected: \(tensor\(float\)\)"):
        sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.1])})
    with pytest.raises(InputError, match="expected float"):
        sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.1, 0.2], np.float32)})
    before = sess.get_state()
    sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.0], np.float32)})
    assert all(np.array_equal(before[k], v) for k, v in sess.get_state().items())
    sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.5], np.float32)})
    assert not np.array_equal(before["fc2.bias"], sess.get_state()["fc2.bias"])


# ---- which weights are trained ----------------------------------------------------------------------
