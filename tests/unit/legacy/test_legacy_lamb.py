"""The legacy LambOptimizer against a float64 re-implementation of ORT's Lamb definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ort_torch_train.optim.lamb import lamb
from tests.helpers.legacy_models import F32, WEIGHTS, batches, initial, lrs, params_for, session, train

STEPS = 20


def lamb_reference(data, rates, floats: dict[str, dict], bias: int, clip: bool):
    """Forward, backward, global-norm clipping and ORT's LambOptimizer (lamb_impl.cu), in float64."""
    w = {n: torch.tensor(initial(n), dtype=torch.float64) for n in WEIGHTS}
    m = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    v = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    losses = []
    for t, ((x, y), lr) in enumerate(zip(data, rates), start=1):
        leaves = {n: w[n].clone().requires_grad_() for n in WEIGHTS}
        h = torch.relu(torch.from_numpy(x).double() @ leaves["fc1.weight"].T + leaves["fc1.bias"])
        loss = torch.nn.functional.cross_entropy(h @ leaves["fc2.weight"].T + leaves["fc2.bias"], torch.from_numpy(y))
        g = dict(zip(WEIGHTS, torch.autograd.grad(loss, [leaves[n] for n in WEIGHTS])))
        losses.append(loss.item())
        norm = math.sqrt(sum(float((g[n] ** 2).sum()) for n in WEIGHTS))
        for n in WEIGHTS:
            a = {
                "alpha": 0.9,
                "beta": 0.999,
                "lambda": 0.0,
                "epsilon": 1e-6,
                "max_norm_clip": 1.0,
                "ratio_min": -math.inf,
                "ratio_max": math.inf,
                **floats[n],
            }
            a = {k: F32(val) for k, val in a.items()}
            gn = g[n] / (norm / a["max_norm_clip"]) if clip and norm > a["max_norm_clip"] else g[n]
            m[n] = a["alpha"] * m[n] + (1 - a["alpha"]) * gn
            v[n] = a["beta"] * v[n] + (1 - a["beta"]) * gn * gn
            bc1, bc2 = (1 - a["alpha"] ** t, 1 - a["beta"] ** t) if bias else (1.0, 1.0)
            r = a["lambda"] * w[n] + (m[n] / bc1) / ((v[n] / bc2).sqrt() + a["epsilon"])
            w_norm, r_norm = float(w[n].norm()), float(r.norm())
            ratio = w_norm / r_norm if w_norm != 0 and r_norm != 0 else 1.0
            ratio = min(max(ratio, a["ratio_min"]), a["ratio_max"])
            w[n] = w[n] - lr * ratio * r
    return losses, w, m, v


@pytest.mark.parametrize("bias, clip", [(0, True), (1, False)])
def test_lamb_matches_the_float64_reference_for_20_steps(bias, clip):
    data, rates = batches(STEPS), [F32(r / 5) for r in lrs(STEPS)]
    floats = {n: {"alpha": 0.85, "beta": 0.99, "epsilon": 1e-6, "max_norm_clip": 0.5} for n in WEIGHTS}
    floats["fc1.weight"]["lambda"] = 0.02
    floats["fc2.weight"].update(ratio_min=0.05, ratio_max=0.5)  # the trust ratio's bounds bite here
    floats["fc1.bias"]["ratio_max"] = 2.0
    ints = {n: {"do_bias_correction": bias} for n in WEIGHTS}
    p = params_for("LambOptimizer", enable_grad_norm_clip=clip)
    p.optimizer_attributes_map, p.optimizer_int_attributes_map = floats, ints
    sess = session(p)
    losses = train(sess, data, rates)
    expected, w, m, v = lamb_reference(data, rates, floats, bias, clip)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-5)
    state = sess.get_state()
    for n in WEIGHTS:
        np.testing.assert_allclose(state[n], w[n].numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(state[f"Moment_1_{n}"], m[n].numpy(), rtol=1e-4, atol=1e-7)
        assert state[f"Update_Count_{n}"].tolist() == [STEPS + 1]


def test_lamb_kernel_trust_ratio_bounds_and_zero_weights():
    w, g = torch.zeros(3), torch.tensor([1.0, -2.0, 3.0])
    m, v = torch.zeros(3), torch.zeros(3)
    lamb([w], [g], [m], [v], lr=0.1, step=1, alpha=0.9, beta=0.999, lambda_=0.0, epsilon=1e-6)
    r = (0.1 * g) / ((0.001 * g * g).sqrt() + 1e-6)
    torch.testing.assert_close(w, -0.1 * r)  # ||w|| = 0: ratio 1
    w2 = torch.full((3,), 10.0)
    before = w2.clone()
    lamb(
        [w2],
        [g],
        [torch.zeros(3)],
        [torch.zeros(3)],
        lr=0.1,
        step=1,
        alpha=0.9,
        beta=0.999,
        lambda_=0.0,
        epsilon=1e-6,
        ratio_max=0.5,
    )
    torch.testing.assert_close(before - w2, 0.1 * 0.5 * r)  # the ratio ||w||/||r|| >> 0.5 is clamped
    with pytest.raises(ValueError, match="step"):
        lamb([w], [g], [m], [v], lr=0.1, step=0, alpha=0.9, beta=0.999, lambda_=0.0, epsilon=1e-6)


def test_lamb_kernel_leaves_non_finite_elements_alone():
    """ORT's lamb_impl.cu, per element: a non-finite direction is 0 and keeps its moments; a weight
    whose update is not finite keeps its value. The other elements update as usual."""
    big = torch.finfo(torch.float32).max
    w = torch.tensor([1.0, 2.0, -3.0, big])
    g = torch.tensor([0.5, float("inf"), float("nan"), -1.0])
    m, v = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.01, 0.02, 0.03, 0.04])
    m0, v0 = m.clone(), v.clone()
    lamb([w], [g], [m], [v], lr=1.0, step=1, alpha=0.9, beta=0.999, lambda_=0.0, epsilon=1e-6, ratio_max=1e30)
    w64, g64, m64, v64 = (t.double() for t in (torch.tensor([1.0, 2.0, -3.0, big]), g, m0, v0))
    m_new, v_new = 0.9 * m64 + 0.1 * g64, 0.999 * v64 + 0.001 * g64 * g64
    r = torch.where(torch.tensor([True, False, False, True]), m_new / (v_new.sqrt() + 1e-6), 0.0)
    ratio = min(float((w64.float().square().sum() / r.float().square().sum()).sqrt()), 1e30)  # sum(w*w) is inf
    assert ratio == 1e30
    expected_w = torch.tensor([float(w64[0] - ratio * r[0]), 2.0, -3.0, float(w64[3] - ratio * r[3])])
    torch.testing.assert_close(w, expected_w.float())
    assert w[1] == 2.0 and w[2] == -3.0  # direction 0 for the inf and nan gradients
    assert torch.isfinite(w).all()
    torch.testing.assert_close(m, torch.tensor([float(m_new[0]), 0.2, 0.3, float(m_new[3])]))
    torch.testing.assert_close(v, torch.tensor([float(v_new[0]), 0.02, 0.03, float(v_new[3])]))
    w2 = torch.tensor([big, 1.0])
    lamb(
        [w2],
        [torch.tensor([-1.0, -1.0])],
        [torch.zeros(2)],
        [torch.zeros(2)],
        lr=1.0,
        step=1,
        alpha=0.9,
        beta=0.999,
        lambda_=0.0,
        epsilon=1e-6,
        ratio_max=1e38,
    )
    assert w2[0] == big  # big + 3.16e38 overflows: the element keeps its value
    assert 3e38 < w2[1] < 3.3e38  # 1 + 1e38 * 3.16: updated
