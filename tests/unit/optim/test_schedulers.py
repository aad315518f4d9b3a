"""Learning-rate schedule functions: ORT's linear formula against a recorded ORT run, plus validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ort_torch_train.optim.schedulers import (
    check_learning_rate,
    constant_with_warmup,
    cosine_with_warmup,
    linear_with_warmup,
    scheduled_learning_rate,
)
from tests.helpers.paths import REFCORPUS

F32 = np.float32


@pytest.mark.skipif(not (REFCORPUS / "mlp").is_dir(), reason="refcorpus not available")
def test_linear_matches_ort_recorded_learning_rates():
    """The mlp run called LinearLRScheduler(opt, 3, 20, 0.01) positionally; ORT 1.19.2's binding swapped the
    counts, so it ran warmup=20, total=3. Replayed with those counts, the formula gives ORT's float32 lrs
    bit for bit: before each step (completed steps 0..19) and after each step (1..20)."""
    expected = json.loads((REFCORPUS / "mlp" / "expected.json").read_text())
    arrays = np.load(REFCORPUS / "mlp" / "arrays.npz")
    scheduler = expected["scheduler"]
    assert (scheduler["warmup_step_count"], scheduler["total_step_count"]) == (3, 20)
    warmup, total = scheduler["total_step_count"], scheduler["warmup_step_count"]  # what ORT ran
    initial_lr = scheduler["initial_lr"]
    # The validated function needs warmup <= total: for completed steps 0..20 (< warmup, then == warmup)
    # total=3 and total=warmup give the same factors, max(0, negative) and 0.
    replay = [scheduled_learning_rate(initial_lr, linear_with_warmup(s, warmup, max(total, warmup))) for s in range(21)]
    assert [float(F32(x)) for x in expected["train"]["lr_before_each_step"]] == replay[:20]
    assert arrays["lr_after_each_step"].tolist() == replay[1:]
    assert expected["lr_after_setup"] == replay[0] == 0.0
    documented = [scheduled_learning_rate(initial_lr, linear_with_warmup(s, 3, 20)) for s in range(20)]
    assert documented != replay[:20]


@pytest.mark.parametrize("step,expected", [(0, 0.0), (1, 0.25), (3, 0.75), (4, 1.0), (7, 0.5), (10, 0.0), (15, 0.0)])
def test_linear_with_warmup(step, expected):
    assert linear_with_warmup(step, 4, 10) == pytest.approx(expected)


def test_linear_edge_cases_follow_the_max_one_guards():
    assert linear_with_warmup(0, 0, 0) == 0.0  # step >= warmup, (0 - 0) / max(1, 0)
    assert linear_with_warmup(0, 0, 5) == 1.0
    assert linear_with_warmup(5, 5, 5) == 0.0


def test_cosine_with_warmup():
    assert cosine_with_warmup(1, 2, 10) == 0.5
    assert cosine_with_warmup(2, 2, 10) == 1.0
    assert cosine_with_warmup(6, 2, 10) == pytest.approx(0.5)
    assert cosine_with_warmup(10, 2, 10) == pytest.approx(0.0)
    assert cosine_with_warmup(50, 2, 10, min_ratio=0.1) == pytest.approx(0.1)
    assert cosine_with_warmup(4, 0, 8, min_ratio=0.2) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi / 2)))


def test_constant_with_warmup():
    assert [constant_with_warmup(s, 4) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert constant_with_warmup(0, 0) == 1.0


def test_scheduled_learning_rate_is_a_float32_product():
    assert scheduled_learning_rate(0.01, 1 / 3) == float(F32(0.01) * F32(1 / 3))


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: linear_with_warmup(-1, 2, 5), "step must be >= 0"),
        (lambda: linear_with_warmup(0, -2, 5), "warmup step count must be >= 0"),
        (lambda: linear_with_warmup(0, 2, -5), "total step count must be >= 0"),
        (lambda: linear_with_warmup(0, 30, 20), r"warmup step count \(30\) must not exceed total step count \(20\)"),
        (lambda: cosine_with_warmup(0, 1, 5, min_ratio=-0.1), r"min_ratio must be a number in \[0, 1\]"),
        (lambda: cosine_with_warmup(0, 1, 5, min_ratio=float("nan")), r"min_ratio must be a number in \[0, 1\]"),
        (lambda: constant_with_warmup(0, -1), "warmup must be >= 0"),
        (lambda: check_learning_rate(float("nan")), "learning rate must be finite and >= 0; got nan"),
        (lambda: check_learning_rate(-0.1), "learning rate must be finite and >= 0; got -0.1"),
        (lambda: check_learning_rate(float("inf")), "learning rate must be finite"),
        (lambda: check_learning_rate(1e39), "must fit in float32"),
    ],
)
def test_validation_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: linear_with_warmup(1.5, 2, 5),
        lambda: linear_with_warmup(True, 2, 5),
        lambda: constant_with_warmup(0, "3"),
        lambda: check_learning_rate("0.1"),
    ],
)
def test_type_errors(call):
    with pytest.raises(TypeError):
        call()
