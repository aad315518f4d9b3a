"""Moving parameters and gradients into flat buffers never needs twice their memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PIECES, PIECE_MB = 8, 16

SCRIPT = textwrap.dedent(
    f"""
    import resource
    import torch
    from ort_torch_train.checkpoint.state import TrainingState
    from ort_torch_train.training.flat_params import flatten_state

    def rss_mb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    elements = {PIECE_MB} * 2**20 // 4
    params = {{f"p{{i}}": torch.nn.Parameter(torch.randn(elements)) for i in range({PIECES})}}
    state = TrainingState(params)  # zero gradients for each
    before = rss_mb()
    assert abs(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before) < {PIECE_MB}, "peak above current"
    flat = flatten_state(state, list(params), ())
    assert flat is not None and params["p3"].data_ptr() == flat.params[3 * elements :].data_ptr()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before)
    """
)


def test_flattening_frees_each_old_tensor_as_it_copies():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    growth_mb = float(out.stdout.strip().splitlines()[-1])
    # copying a whole kind before freeing the old tensors (torch.cat) grows the peak by PIECES * PIECE_MB
    assert growth_mb < 3 * PIECE_MB, f"peak RSS grew {growth_mb:.0f} MB while flattening {PIECES} x {PIECE_MB} MB"
