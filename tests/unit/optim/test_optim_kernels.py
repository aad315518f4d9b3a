"""The AdamW / SGD / clip kernels against float64 references of ORT's formulas (and each other)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ort_torch_train.optim.adamw import AdamWHyperparameters, adamw, choose_adamw_implementation, ort_step_scalars
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.scratch import make_scratch
from ort_torch_train.optim.sgd import SGDHyperparameters, sgd

SHAPES = [(16, 9), (9,), (3, 5, 2), (1,)]
STEPS = 5
BETA1, BETA2 = 0.9, 0.999
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _random_problem(seed: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [
        [torch.randn(s, generator=gen) * 10.0 ** float(torch.empty(()).uniform_(-3, 1, generator=gen)) for s in SHAPES]
        for _ in range(STEPS)
    ]
    return [p.to(device) for p in params], [[g.to(device) for g in gs] for gs in grads]


def _run_adamw(
    params,
    grads_per_step,
    *,
    lr=0.01,
    eps=1e-6,
    weight_decay=0.0,
    adam_mode=1,
    correct_bias=True,
    implementation=None,
    with_scratch=False,
):
    params = [p.clone() for p in params]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    scratch = make_scratch(params, 2) if with_scratch else None
    hyperparameters = AdamWHyperparameters(lr, BETA1, BETA2, eps, weight_decay, adam_mode, correct_bias)
    for step, grads in enumerate(grads_per_step, start=1):
        adamw(
            params,
            [g.clone() for g in grads],
            exp_avgs,
            exp_avg_sqs,
            hyperparameters,
            step=step,
            implementation=implementation,
            scratch=scratch,
        )
    return params, exp_avgs, exp_avg_sqs


def _reference_adamw(params, grads_per_step, *, lr, eps, weight_decay, adam_mode, correct_bias):
    """ORT's AdamWOptimizer (adamw.cc) in float64, hyperparameters as the float32 attributes."""
    b1, b2, eps, lr, wd = (float(np.float32(x)) for x in (BETA1, BETA2, eps, lr, weight_decay))
    ws = [p.double().cpu().clone() for p in params]
    ms = [torch.zeros_like(w) for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    for t, grads in enumerate(grads_per_step, start=1):
        bc1, bc2 = (1 - b1**t, 1 - b2**t) if correct_bias else (1.0, 1.0)
        for w, m, v, g in zip(ws, ms, vs, grads):
            g = g.double().cpu()
            m.mul_(b1).add_((1 - b1) * g)
            v.mul_(b2).add_((1 - b2) * g * g)
            if adam_mode == 0:
                w.sub_(w * lr * wd)
                w.sub_(lr * m / (bc1 * ((v / bc2).sqrt() + eps)))
            else:
                w.sub_(lr * math.sqrt(bc2) / bc1 * m / (v.sqrt() + eps))
                w.sub_(lr * wd * w)
    return ws, ms, vs


ADAMW_CASES = [
    dict(adam_mode=1, correct_bias=True, weight_decay=0.0),
    dict(adam_mode=1, correct_bias=True, weight_decay=0.05),
    dict(adam_mode=1, correct_bias=False, weight_decay=0.05),
    dict(adam_mode=0, correct_bias=True, weight_decay=0.0),
    dict(adam_mode=0, correct_bias=True, weight_decay=0.05),
]


IMPLEMENTATIONS = ["single", "foreach", "fused", None]


def _case_id(case):
    return f"mode{case['adam_mode']}-cb{int(case['correct_bias'])}-wd{case['weight_decay']}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ADAMW_CASES, ids=_case_id)
def test_adamw_matches_float64_reference(case, device):
    params, grads = _random_problem(0, device)
    expected = _reference_adamw(params, grads, lr=0.01, eps=1e-6, **case)
    for implementation in IMPLEMENTATIONS:
        got = _run_adamw(params, grads, implementation=implementation, **case)
        for got_list, expected_list in zip(got, expected):
            for a, b in zip(got_list, expected_list):
                torch.testing.assert_close(
                    a.double().cpu(), b, rtol=1e-5, atol=2e-6, msg=lambda m: f"{implementation}: {m}"
                )


@pytest.mark.parametrize("case", ADAMW_CASES, ids=_case_id)
def test_single_and_foreach_are_bitwise_equal(case):
    """With or without scratch buffers."""
    params, grads = _random_problem(1)
    single = _run_adamw(params, grads, implementation="single", **case)
    foreach = _run_adamw(params, grads, implementation="foreach", **case)
    foreach_scratch = _run_adamw(params, grads, implementation="foreach", with_scratch=True, **case)
    for a_list, b_list, c_list in zip(single, foreach, foreach_scratch):
        assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(a_list, b_list, c_list))


@pytest.mark.parametrize("adam_mode", [0, 1])
def test_foreach_follows_ort_float32_op_order(adam_mode):
    """One step emulated in numpy float32, op by op as in adamw.cc, matches bit for bit.

    sqrt is taken from torch: neither torch's CPU float32 sqrt (within 0.75 ulp) nor ORT's (Eigen's
    fast-math rsqrt + one Newton step) is correctly rounded; every other op is IEEE-exact in all three.
    """
    f = np.float32

    def sqrt(x):
        return torch.sqrt(torch.from_numpy(x)).numpy()

    params, grads = _random_problem(2)
    w, g = params[0].numpy(), grads[0][0].numpy()
    lr, wd, eps = f(0.01), f(0.05), f(1e-6)
    b1, b2 = f(BETA1), f(BETA2)
    m = b1 * np.zeros_like(w) + (f(1) - b1) * g
    v = b2 * np.zeros_like(w) + (f(1) - b2) * g * g
    bc1, bc2, lr_corrected = (f(x) for x in ort_step_scalars(1, float(lr), float(b1), float(b2), True))
    if adam_mode == 0:
        w = w - (w * lr * wd)
        w = w - (lr * m) / (bc1 * (sqrt(v / bc2) + eps))
    else:
        w = w - (lr_corrected * m / (sqrt(v) + eps))
        w = w - (lr * wd) * w
    got, got_m, got_v = _run_adamw(
        params[:1], [grads[0][:1]], weight_decay=0.05, adam_mode=adam_mode, implementation="foreach"
    )
    np.testing.assert_array_equal(got_m[0].numpy(), m)
    np.testing.assert_array_equal(got_v[0].numpy(), v)
    np.testing.assert_array_equal(got[0].numpy(), w)


def test_ort_step_scalars_are_float32_like_ort():
    bc1, bc2, lr_corrected = ort_step_scalars(
        3, float(np.float32(0.01)), float(np.float32(0.9)), float(np.float32(0.999)), True
    )
    f = np.float32
    assert bc1 == f(1) - f(float(f(0.9)) ** 3)
    assert bc2 == f(1) - f(float(f(0.999)) ** 3)
    assert lr_corrected == f(0.01) * (np.sqrt(f(bc2)) / f(bc1))
    assert ort_step_scalars(3, 0.5, 0.9, 0.999, False) == (1.0, 1.0, 0.5)


@pytest.mark.parametrize(
    "adam_mode,lr,weight_decay,correct_bias",
    [(1, 0.0, 0.0, True), (1, 0.5, 2.0, True), (1, 0.5, 2.0, False), (0, 0.0, 0.1, True)],
)
def test_fused_falls_back_where_its_scalars_degenerate(adam_mode, lr, weight_decay, correct_bias):
    params, grads = _random_problem(3)
    case = dict(lr=lr, weight_decay=weight_decay, adam_mode=adam_mode, correct_bias=correct_bias)
    fused = _run_adamw(params, grads, implementation="fused", **case)
    foreach = _run_adamw(params, grads, implementation="foreach", **case)
    for a_list, b_list in zip(fused, foreach):
        for a, b in zip(a_list, b_list):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if lr == 0.0:
        assert all(torch.equal(a, b) for a, b in zip(fused[0], params))  # lr 0: moments move, params do not


def test_default_implementation_choice():
    params, _ = _random_problem(4)
    lists = [params, [p.clone() for p in params], [p.clone() for p in params], [p.clone() for p in params]]
    assert choose_adamw_implementation(*lists) == "fused"
    mixed = [params[:-1] + [params[-1].double()]] + lists[1:]
    assert choose_adamw_implementation(*mixed) == "foreach"


def test_adamw_rejects_bad_arguments():
    params, grads = _random_problem(5)
    m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    base = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0, adam_mode=1, correct_bias=True)
    hyperparameters = AdamWHyperparameters(**base)
    bad = [
        (dict(step=0), "step must be an int >= 1"),
        (dict(adam_mode=2), "adam_mode must be 0"),
        (dict(adam_mode=0, correct_bias=False), "adam_mode 0 requires correct_bias"),
        (dict(beta2=1.0), r"beta2 must be in \[0, 1\)"),
        (dict(beta1=0.99999999), r"beta1 must be in \[0, 1\) as a float32; got 1.0"),
        (dict(implementation="bogus"), "implementation must be one of"),
    ]
    for override, message in bad:
        arguments = {"step": 1, **override}
        hyper = {key: arguments.pop(key) for key in list(arguments) if key in base}
        with pytest.raises(ValueError, match=message):
            adamw(params, grads[0], m, v, AdamWHyperparameters(**{**base, **hyper}), **arguments)
    with pytest.raises(ValueError, match=r"lengths \(4, 3, 4, 4\)"):
        adamw(params, grads[0][:3], m, v, hyperparameters, step=1)
    with pytest.raises(ValueError, match="one floating dtype"):
        adamw(params, grads[0], m, v[:-1] + [v[-1].double()], hyperparameters, step=1, implementation="fused")


def test_adamw_updates_parameters_that_require_grad():
    params = [torch.nn.Parameter(torch.ones(3))]
    adamw(
        params,
        [torch.ones(3)],
        [torch.zeros(3)],
        [torch.zeros(3)],
        AdamWHyperparameters(
            lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, adam_mode=1, correct_bias=True
        ),
        step=1,
    )
    assert params[0].requires_grad and torch.all(params[0] < 1)


@pytest.mark.parametrize("implementation", ["foreach", "single", None])
def test_sgd_rounds_like_ort(implementation):
    """w + (-lr * g), the product rounded before the addition (no fused multiply-add)."""
    params, grads = _random_problem(6)
    expected = [p.numpy() + (-np.float32(0.05)) * g.numpy() for p, g in zip(params, grads[0])]
    for scratch in (None, make_scratch(params, 1)):
        got = [p.clone() for p in params]
        sgd(got, grads[0], SGDHyperparameters(lr=0.05), implementation=implementation, scratch=scratch)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a.numpy(), b)


def test_sgd_rejects_bad_arguments():
    params, grads = _random_problem(7)
    with pytest.raises(ValueError, match=r"lengths \(4, 2\)"):
        sgd(params, grads[0][:2], SGDHyperparameters(lr=0.1))
    with pytest.raises(ValueError, match="implementation must be one of"):
        sgd(params, grads[0], SGDHyperparameters(lr=0.1), implementation="fused")


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_follows_ort_formula(max_norm):
    _, grads = _random_problem(8)
    grads = [g.clone() for g in grads[0]]
    original = [g.clone() for g in grads]
    total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in original))
    coefficient = min(max_norm / (total + 1e-6), 1.0)
    norm = clip_grad_norm_(grads, max_norm)
    assert norm.item() == pytest.approx(total, rel=1e-6)
    for clipped, g in zip(grads, original):
        torch.testing.assert_close(clipped.double(), g.double() * coefficient, rtol=1e-6, atol=0)
    if coefficient == 1.0:
        assert all(torch.equal(a, b) for a, b in zip(grads, original))


def test_clip_grad_norm_rejects_an_empty_list():
    with pytest.raises(ValueError, match="non-empty list"):
        clip_grad_norm_([], 1.0)
