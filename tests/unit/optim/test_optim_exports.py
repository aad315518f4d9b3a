"""The optim package imports its exports at first use: reading an optimizer model imports no torch, and the
exports ``adamw`` and ``sgd`` stay the kernel functions after their modules (named alike) load."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

PROBE = """
import sys
import ort_torch_train.optim.optimizer_model
from ort_torch_train.optim.registry import algorithms
print(sorted(a.display_name for a in algorithms()), "torch" in sys.modules)
import ort_torch_train.optim.adamw, ort_torch_train.optim.sgd
from ort_torch_train.optim import adamw, sgd, read_optimizer_model
print(adamw.__module__, adamw.__name__, sgd.__module__, sgd.__name__, read_optimizer_model.__name__)
"""


def test_optimizer_records_load_without_torch_and_kernel_exports_stay_functions() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=scaled(120), check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "['AdamW', 'SGD'] False",
        "ort_torch_train.optim.adamw adamw ort_torch_train.optim.sgd sgd read_optimizer_model",
    ]
