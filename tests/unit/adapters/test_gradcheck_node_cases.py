"""float64 gradchecks of every converted differentiable operator, on ONNX's backend node cases.

For each operator whose node cases have floating inputs and outputs, its smallest cases are
re-typed to float64 and gradchecked at random inputs (tests/helpers/gradcheck_cases.py). An operator with
floating inputs and outputs is either gradchecked or listed with its reason in ``NOT_DIFFERENTIABLE``;
operators with only integer/bool inputs or outputs (comparisons, ArgMax, shape ops) have nothing to check.
"""

from __future__ import annotations

import pytest

from tests.helpers.gradcheck_cases import (
    NOT_DIFFERENTIABLE,
    SETTINGS_INPUTS,
    all_candidates,
    checked,
    checked_case_names,
    gradcheck,
)

CHECKED = checked_case_names()


@pytest.mark.slow
@pytest.mark.parametrize("candidate", CHECKED, ids=CHECKED)
def test_gradients_match_finite_differences(candidate):
    gradcheck(checked()[candidate])


@pytest.mark.slow
def test_every_floating_operator_is_gradchecked_or_listed():
    unchecked = sorted(op for op, cases in all_candidates().items() if not cases and op not in NOT_DIFFERENTIABLE)
    assert not unchecked, f"no small node case to gradcheck; add one or list with a reason: {unchecked}"
    assert len({c.op for c in checked().values()}) >= 139


@pytest.mark.slow
def test_lists_are_reviewed_and_current():
    assert all(NOT_DIFFERENTIABLE.values()) and all(reason for _, reason in SETTINGS_INPUTS.values())
    stale = sorted((set(NOT_DIFFERENTIABLE) | set(SETTINGS_INPUTS)) - set(all_candidates()))
    assert not stale, f"no node case with floating inputs and outputs for: {stale}"
