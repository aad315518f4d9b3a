"""The same parity checks on a CUDA device (skipped cleanly where torch sees no GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.corpus import loss_of

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _deterministic(case):
    if not case.deterministic:
        pytest.skip("ORT's training step is random here (dropout)")


def test_first_step_on_cuda_matches_ort(case):
    _deterministic(case)
    module = case.module(device="cuda")
    assert all(p.device.type == "cuda" for p in module.parameters())
    loss = loss_of(module(*case.train_inputs(0)))
    assert abs(loss - case.expected["gradient_semantics"]["loss_call1"]) <= 1e-5
    for name in case.trainable_names:
        grad = module.training_state.params[name].grad.cpu().numpy()
        np.testing.assert_allclose(grad, case.arrays[f"grad_step1__{name}"], rtol=1e-4, atol=1e-6)


def test_trajectory_on_cuda_matches_ort(case):
    _deterministic(case)
    module = case.module(device="cuda")
    optimizer = case.optimizer(module)
    losses = []
    for step in range(case.steps):
        optimizer.set_learning_rate(case.lr_before(step))
        losses.append(loss_of(module(*case.train_inputs(step))))
        optimizer.step()
        module.lazy_reset_grad()
    np.testing.assert_allclose(losses, case.expected["train"]["losses"], rtol=0, atol=1e-5)


def test_torch_inputs_stay_on_device(mlp_case):
    module = mlp_case.module(device="cuda")
    inputs = [torch.from_numpy(a).cuda() for a in mlp_case.train_inputs(0)]
    loss = module(*inputs)
    assert isinstance(loss, torch.Tensor) and loss.device.type == "cuda"


def test_module_moves_between_devices(mlp_case):
    module = mlp_case.module()
    optimizer = mlp_case.optimizer(module)
    cpu_loss = loss_of(module(*mlp_case.train_inputs(0)))
    module.lazy_reset_grad()
    module.to("cuda")
    assert module.training_state.params[mlp_case.param_names[0]].device.type == "cuda"
    assert abs(loss_of(module(*mlp_case.train_inputs(0))) - cpu_loss) <= 1e-5
    optimizer.step()  # the optimizer follows the move
    assert optimizer._engine.state.optimizer.momentums[mlp_case.trainable_names[0]]["momentum0"].device.type == "cuda"


@pytest.mark.compile
@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_compiled_one_graph_step_on_cuda_matches_ort(case, compile):
    _deterministic(case)
    from ort_torch_train.api import Module

    evaluation = case.artifact("eval_model.onnx")
    module = Module(case.artifact("training_model.onnx"), case.load_state(), evaluation, device="cuda", compile=compile)
    optimizer = case.optimizer(module)
    losses = []
    for step in range(case.steps):
        optimizer.set_learning_rate(case.lr_before(step))
        losses.append(loss_of(module.step(optimizer, *case.train_inputs(step))))
    np.testing.assert_allclose(losses, case.expected["train"]["losses"], rtol=0, atol=1e-5)


@pytest.mark.compile
def test_reduce_overhead_step_replays_one_cuda_graph(mlp_case):
    from torch._dynamo.utils import counters

    from ort_torch_train.api import Module

    module = Module(
        mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), device="cuda", compile="reduce-overhead"
    )
    optimizer = mlp_case.optimizer(module)
    skips = counters["inductor"]["cudagraph_skips"]
    losses = [module.step(optimizer, *mlp_case.train_inputs(step)) for step in range(3)]
    kept = [float(loss) for loss in losses]
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as profiler:
        losses.append(module.step(optimizer, *mlp_case.train_inputs(3)))
        torch.cuda.synchronize()
    assert counters["inductor"]["cudagraph_skips"] == skips  # parameters, gradients and moments are static
    assert "cudaGraphLaunch" in {event.name for event in profiler.events()}
    # a returned loss is the caller's: later replays do not overwrite it
    assert [float(loss) for loss in losses[:3]] == kept and len(set(kept)) == 3


@pytest.mark.compile
def test_reduce_overhead_three_call_loop_replays_cuda_graphs(mlp_case):
    from torch._dynamo.utils import counters

    from ort_torch_train.api import Module

    module = Module(
        mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), device="cuda", compile="reduce-overhead"
    )
    optimizer = mlp_case.optimizer(module)
    skips = counters["inductor"]["cudagraph_skips"]
    losses = []
    for step in range(4):
        optimizer.set_learning_rate(mlp_case.lr_before(step))
        losses.append(loss_of(module(*mlp_case.train_inputs(step))))
        optimizer.step()
        module.lazy_reset_grad()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as profiler:
        module(*mlp_case.train_inputs(4))
        torch.cuda.synchronize()
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert "cudaGraphLaunch" in {event.name for event in profiler.events()}
    np.testing.assert_allclose(losses, mlp_case.expected["train"]["losses"][:4], rtol=0, atol=1e-5)
