"""Eager training never loads Dynamo, inductor or sympy (torch_internals loads them on first use): an\neager run of the transformer fixture, its checkpoint saved, an eager oneDNN product and an Expand to a\nrun-time shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ort_torch_train.adapters.shape_ops import broadcast_shape
from tests.helpers.timeouts import scaled

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, sys
from ort_torch_train.api import CheckpointState
from tests.helpers.corpus import Case
case = Case(__import__("pathlib").Path(sys.argv[1]))
state = case.load_state()
module = case.module(state)
optimizer = case.optimizer(module)
for step in range(2):
    module(*case.train_inputs(step))
    optimizer.step()
    module.lazy_reset_grad()
module.eval()
module(*case.eval_inputs())
CheckpointState.save_checkpoint(state, sys.argv[2])
import torch
from ort_torch_train.passes.onednn_linear import linear
from ort_torch_train.adapters.shape_ops import broadcast_shape, expand_dynamic
x, w = torch.randn(256, 256, requires_grad=True), torch.randn(256, 256, requires_grad=True)
linear(x, w).sum().backward()  # large enough for the eager oneDNN product
assert broadcast_shape((3, 1, 4), (5, 1)) == (3, 5, 4)
assert expand_dynamic(torch.ones(3, 1), torch.tensor([2, 1, 4])).shape == (2, 3, 4)  # a run-time shape
heavy = ("torch._dynamo", "torch._inductor", "sympy", "torch.fx.experimental.symbolic_shapes")
print(json.dumps(sorted(name for name in heavy if name in sys.modules)))
"""


def test_an_eager_run_loads_no_compiler_modules(tmp_path: Path) -> None:
    case = ROOT / "tests" / "fixtures" / "transformer"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(case), str(tmp_path / "checkpoint")],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def test_expand_broadcasts_as_numpy_and_refuses_what_torch_refuses() -> None:
    for first, second in [((3, 1, 4), (5, 1)), ((0, 1), (1, 7)), ((1,), ()), ((2, 3), (2, 3))]:
        assert broadcast_shape(first, second) == tuple(torch.broadcast_shapes(first, second))
    with pytest.raises(RuntimeError, match=r"\[2, 3\] and \[4, 3\] cannot be broadcast"):
        broadcast_shape((2, 3), (4, 3))
