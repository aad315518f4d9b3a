"""The inductor settings the suite runs under (tests/conftest.py) build the kernels a user's process builds:
with inductor's vector-ISA probes skipped, it picks the instruction sets its probes pick on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

pytestmark = pytest.mark.slow  # g++ builds each probe: no other process of the suite probes
SKIP_PROBES = "TORCHINDUCTOR_VEC_ISA_OK"
PICKS = """
import json
from torch._inductor import config, cpu_vec_isa

valid = cpu_vec_isa.valid_vec_isa_list()
print(json.dumps({
    "probed": config.cpp.vec_isa_ok is None,
    "valid": [str(isa) for isa in valid],
    "picked": str(cpu_vec_isa.pick_vec_isa()),
    "extensions": {str(isa): sorted(k for k, v in vars(isa).items() if k.startswith("_is_") and v) for isa in valid},
}))
"""


def _picks(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PICKS], env=env, cwd=ROOT, capture_output=True, text=True, timeout=scaled(300)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def test_skipping_the_vector_isa_probes_picks_what_they_pick() -> None:
    assert os.environ.get(SKIP_PROBES) == "1", "tests/conftest.py no longer skips the probes: drop this test"
    suite = _picks(dict(os.environ))
    probed = _picks({name: value for name, value in os.environ.items() if name != SKIP_PROBES})
    assert (suite.pop("probed"), probed.pop("probed")) == (False, True)
    assert suite == probed
