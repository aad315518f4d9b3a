"""Eager training never loads Dynamo, inductor or sympy (torch_internals loads them on first use)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
heavy = ("torch._dynamo", "torch._inductor", "sympy", "torch.fx.experimental.symbolic_shapes")
print(json.dumps(sorted(name for name in heavy if name in sys.modules)))
"""


def test_an_eager_run_loads_no_compiler_modules(tmp_path: Path) -> None:
    case = ROOT / "tests" / "fixtures" / "transformer"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(case), str(tmp_path / "checkpoint")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
