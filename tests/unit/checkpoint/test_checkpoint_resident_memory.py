"""A loaded checkpoint trained by the optimizer keeps resident only its tensors, not the file read."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from ort_torch_train.state.training_state import TrainingState
from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled

# a GPT-2-like mix: one large embedding, per layer a few MB-sized matrices and small vectors
SIZES = {"embedding": 20 * 2**18}
for layer in range(12):
    SIZES.update({f"h{layer}.attn": 3 * 2**18, f"h{layer}.proj": 2**18, f"h{layer}.fc": 4 * 2**18})
    SIZES.update({f"h{layer}.mlp_proj": 4 * 2**18, f"h{layer}.bias": 768, f"h{layer}.norm": 768})

SCRIPT = textwrap.dedent(
    """
    import sys
    from ort_torch_train.state.training_state import TrainingState
    from ort_torch_train.optim.engine import OptimizerEngine
    from ort_torch_train.optim.optimizer_model import read_optimizer_model

    def rss_mb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    before = rss_mb()
    state = TrainingState.load(sys.argv[1])
    OptimizerEngine(read_optimizer_model(sys.argv[2]), state, list(state.params))
    print(rss_mb() - before)
    """
)


def test_parameters_gradients_and_moments_are_all_that_stays_resident(tmp_path: Path) -> None:
    params = {name: torch.nn.Parameter(torch.randn(size)) for name, size in SIZES.items()}
    TrainingState(params).save(tmp_path / "checkpoint")
    optimizer_model = FIXTURES / "mlp_ce_adamw_sched" / "artifacts" / "optimizer_model.onnx"
    command = [sys.executable, "-c", SCRIPT, str(tmp_path / "checkpoint"), str(optimizer_model)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=scaled(120), check=True)
    growth_mb = float(out.stdout.strip().splitlines()[-1])
    tensors_mb = 4 * sum(SIZES.values()) * 4 / 2**20  # parameters, gradients, two AdamW moments
    assert growth_mb < tensors_mb * 1.15, f"{growth_mb:.0f} MB resident for {tensors_mb} MB of tensors"
