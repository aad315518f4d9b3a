"""tools/training_digest.py: a case's digest is the same on every run and changes when the training does."""

from __future__ import annotations

from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.scripts import load_script

digests = load_script(ROOT / "tools" / "training_digest.py")


def test_a_cases_digest_repeats_and_differs_between_cases() -> None:
    first = digests.training_digest(FIXTURES / "mlp_ce_adamw_sched", compile=False)
    assert digests.training_digest(FIXTURES / "mlp_ce_adamw_sched", compile=False) == first
    assert digests.training_digest(FIXTURES / "mlp_frozen", compile=False) != first
