"""A one-graph step that overwrites the gradients frees their memory first and hands its own to the same
``.grad`` tensors: values as eager training gives them, one set of gradients at the step's peak."""

from __future__ import annotations

import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.state import fresh_gradients
from tests.helpers.corpus import Case
from tests.helpers.step_peak import run_printing_mb
from tests.helpers.timeouts import scaled


def _trained(case: Case, compile: bool, state: CheckpointState | None = None) -> tuple[Module, Optimizer]:
    state = state if state is not None else case.load_state()
    module = Module(case.artifact("training_model.onnx"), state, compile=compile)
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    optimizer.set_learning_rate(1e-2)
    return module, optimizer


@pytest.fixture
def every_buffer_afresh(monkeypatch):
    """The MLP's gradient buffer (under a MiB) refilled afresh too."""
    monkeypatch.setattr(fresh_gradients, "MIN_BYTES", 0)


def _grads(module: Module) -> list[torch.Tensor]:
    return [p.grad for p in module.parameters() if p.requires_grad]


@pytest.mark.compile
def test_one_graph_steps_leave_their_gradients_in_the_same_tensors(mlp_case, every_buffer_afresh):
    """The ``.grad`` tensors, a torch view and a numpy view of a gradient taken after the first step show
    each later step's gradients, as eager training gives them; every step is the same one graph."""
    torch._dynamo.reset()
    counters.clear()
    states = {compile: mlp_case.load_state() for compile in (False, True)}
    eager, eager_optimizer = _trained(mlp_case, compile=False, state=states[False])
    compiled, compiled_optimizer = _trained(mlp_case, compile=True, state=states[True])
    name = compiled.trainable_parameter_names[0]
    compiled.step(compiled_optimizer, *mlp_case.train_inputs(0))
    tensors, flat = _grads(compiled), compiled.training_state.flat
    assert flat is not None
    view = tensors[0][:1]  # taken before a step: shows the gradients of each step after it, as before
    eager.step(eager_optimizer, *mlp_case.train_inputs(0))
    numpy_views = {compile: states[compile].parameters[name].grad for compile in (False, True)}  # zero-copy
    np.testing.assert_allclose(numpy_views[True], numpy_views[False], rtol=1e-5, atol=1e-6)
    for step in (1, 2):
        eager.step(eager_optimizer, *mlp_case.train_inputs(step))
        compiled.step(compiled_optimizer, *mlp_case.train_inputs(step))
        np.testing.assert_allclose(numpy_views[True], numpy_views[False], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(numpy_views[True], states[True].parameters[name].grad)
    assert _grads(compiled) == tensors and all(a is b for a, b in zip(_grads(compiled), tensors))
    assert compiled.training_state.flat is flat and flat.still_behind(gradients=True)
    for grad in tensors:
        assert grad.untyped_storage().data_ptr() == flat.grads.untyped_storage().data_ptr()
    for got, expected in zip(tensors, _grads(eager), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(view, _grads(eager)[0][:1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        compiled.get_contiguous_parameters().numpy(), eager.get_contiguous_parameters().numpy(), rtol=0, atol=1e-5
    )
    assert counters["stats"]["unique_graphs"] == 1  # every step overwrote the gradients: one graph


def test_parameter_grad_waits_for_a_step_in_another_thread(mlp_case):
    """A step holds the state's lock while the gradients' memory may be released; Parameter.grad waits."""
    state = mlp_case.load_state()
    name = next(name for name, parameter in state.parameters if parameter.requires_grad)
    stepping, done = threading.Event(), threading.Event()

    def step() -> None:
        with state.training_state.lock:
            stepping.set()
            done.wait(timeout=scaled(30))

    stepper = threading.Thread(target=step)
    stepper.start()
    stepping.wait(timeout=scaled(30))
    read: list = []
    reader = threading.Thread(target=lambda: read.append(state.parameters[name].grad))
    reader.start()
    reader.join(timeout=scaled(0.3))
    assert reader.is_alive() and not read  # waits while the step holds the lock
    done.set()
    stepper.join(timeout=scaled(30))
    reader.join(timeout=scaled(30))
    assert len(read) == 1 and read[0].shape == state.parameters[name].data.shape


@pytest.mark.compile
def test_a_step_after_accumulating_adds_to_the_gradients(mlp_case, every_buffer_afresh):
    eager, eager_optimizer = _trained(mlp_case, compile=False)
    compiled, compiled_optimizer = _trained(mlp_case, compile=True)
    for module, optimizer in ((eager, eager_optimizer), (compiled, compiled_optimizer)):
        module.step(optimizer, *mlp_case.train_inputs(0))  # overwrites
        module(*mlp_case.train_inputs(1))  # overwrites, then the step adds to it
        module.step(optimizer, *mlp_case.train_inputs(2))
        module(*mlp_case.train_inputs(3))  # eager accumulation on the tensors the one-graph step filled
    for got, expected in zip(_grads(compiled), _grads(eager), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        compiled.get_contiguous_parameters().numpy(), eager.get_contiguous_parameters().numpy(), rtol=0, atol=1e-5
    )


@pytest.mark.compile
def test_a_failed_step_leaves_zero_gradients_and_the_reset_pending(mlp_case, every_buffer_afresh):
    compiled, compiled_optimizer = _trained(mlp_case, compile=True)
    eager, eager_optimizer = _trained(mlp_case, compile=False)
    x, y = mlp_case.train_inputs(0)
    compiled.step(compiled_optimizer, x, y)
    eager.step(eager_optimizer, x, y)
    bad = y.copy()
    bad[0] = 99
    with pytest.raises(IndexError, match="class index 99 is out of range"):
        compiled.step(compiled_optimizer, x, bad)
    assert all(g.shape == p.shape and not g.any() for g, p in zip(_grads(compiled), compiled.parameters()))
    compiled(*mlp_case.train_inputs(1))  # overwrites: the failed step's reset is still pending
    eager(*mlp_case.train_inputs(1))
    for got, expected in zip(_grads(compiled), _grads(eager), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.compile
def test_a_small_gradient_buffer_stays_in_place(mlp_case):
    module, optimizer = _trained(mlp_case, compile=True)
    module.step(optimizer, *mlp_case.train_inputs(0))
    flat = module.training_state.flat
    assert flat is not None and not fresh_gradients.pays_off(flat)
    address = flat.grads.data_ptr()
    for step in (1, 2):
        module.step(optimizer, *mlp_case.train_inputs(step))
    assert flat.grads.data_ptr() == address  # written in place by the graph


PEAK_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
    from tests.helpers.step_peak import step_peak_growth_mb

    torch.manual_seed(0)
    layers = [module for _ in range(8) for module in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 8))
    generate_artifacts(
        model, example_inputs=(torch.zeros(4, 1024),), input_names=["x"], output_names=["logits"],
        loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW, artifact_directory=sys.argv[1],
    )
    module = Module(f"{sys.argv[1]}/training_model.onnx", CheckpointState.load_checkpoint(f"{sys.argv[1]}/checkpoint"),
                    compile=True)
    optimizer = Optimizer(f"{sys.argv[1]}/optimizer_model.onnx", module)
    x, y = np.ones((4, 1024), np.float32), np.arange(4, dtype=np.int64)
    print(step_peak_growth_mb(lambda: module.step(optimizer, x, y)))
    """
)
GRADIENT_MB = (8 * (1024 * 1024 + 1024) + 1024 * 8 + 8) * 4 / 2**20  # 4 MB for the largest parameter


@pytest.mark.compile
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads and resets the peak RSS in /proc")
def test_a_one_graph_step_never_holds_two_sets_of_gradients(tmp_path):
    growth_mb = run_printing_mb(PEAK_SCRIPT, tmp_path)
    # keeping the old gradients through the step adds a second set (GRADIENT_MB, 32 MB) to its peak
    assert growth_mb < GRADIENT_MB / 2, f"a step's peak RSS grew {growth_mb:.1f} MB over its start"
