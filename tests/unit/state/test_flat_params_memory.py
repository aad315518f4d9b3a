"""Moving parameters and gradients into flat buffers never needs twice their memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.state.flat import zeros_in_one_buffer
from ort_torch_train.state.training_state import OptimizerState, TrainingState
from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled

PIECES, PIECE_MB = 8, 16

SCRIPT = textwrap.dedent(
    f"""
    import torch
    from ort_torch_train.state.training_state import TrainingState
    from tests.helpers.step_peak import status_mb

    elements = {PIECE_MB} * 2**20 // 4
    params = {{f"p{{i}}": torch.nn.Parameter(torch.full((elements,), float(i))) for i in range({PIECES})}}
    state = TrainingState(params)  # zero gradients for each
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # the peak (VmHWM) starts again from the current RSS
    before = status_mb("VmRSS")
    flat = state.flat_view(list(params), ())
    assert flat is not None and params["p3"].data_ptr() == flat.params[3 * elements :].data_ptr()
    print(status_mb("VmHWM") - before)
    """
)


def test_flattening_frees_each_old_tensor_as_it_copies():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=scaled(120))
    assert out.returncode == 0, out.stderr[-2000:]
    growth_mb = float(out.stdout.strip().splitlines()[-1])
    # copying a whole kind before freeing the old tensors (torch.cat) grows the peak by PIECES * PIECE_MB
    assert growth_mb < 3 * PIECE_MB, f"peak RSS grew {growth_mb:.0f} MB while flattening {PIECES} x {PIECE_MB} MB"


def test_tensors_already_end_to_end_in_one_buffer_are_adopted_without_a_copy():
    params = {name: torch.nn.Parameter(torch.randn(shape)) for name, shape in [("a", (3, 4)), ("b", (5,))]}
    state = TrainingState(params, optimizer=OptimizerState("group0", 0, 1e-3, {}))
    zeros = zeros_in_one_buffer([p.detach() for p in params.values()])
    assert len({z.untyped_storage().data_ptr() for z in zeros}) == 1
    state.optimizer.momentums.update({name: {"momentum0": z} for name, z in zip(params, zeros)})
    flat = state.flat_view(list(params), ("momentum0",))
    assert flat is not None
    assert flat.moments[0].data_ptr() == zeros[0].data_ptr()  # the zeros' buffer itself
    assert flat.params.data_ptr() != 0 and params["b"].data_ptr() == flat.params[12:].data_ptr()


def test_the_optimizer_makes_its_moments_as_views_of_its_flat_buffer():
    artifacts = FIXTURES / "mlp_ce_adamw_sched" / "artifacts"
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = Module(str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"))
    Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    training_state = state.training_state
    assert training_state.flat is not None and training_state.optimizer is not None
    first_moments = [moments["momentum0"] for moments in training_state.optimizer.momentums.values()]
    assert {m.untyped_storage().data_ptr() for m in first_moments} == {training_state.flat.moments[0].data_ptr()}
