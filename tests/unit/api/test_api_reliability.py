"""Threads, a failed step, and ORT's observable texts and types."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, OrtValue
from ort_torch_train.errors import NominalStateError
from tests.helpers.timeouts import scaled


def test_two_threads_on_one_module_lose_no_step(mlp_case):
    module = mlp_case.module()
    optimizer = mlp_case.optimizer(module)
    inputs = mlp_case.train_inputs(0)
    start = module.training_state.optimizer.step

    def train(count: int) -> None:
        for _ in range(count):
            module(*inputs)
            optimizer.step()
            module.lazy_reset_grad()

    threads = [threading.Thread(target=train, args=(150,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=scaled(120))
    assert module.training_state.optimizer.step - start == 300


def test_save_while_another_thread_trains_writes_consistent_states(mlp_case, tmp_path):
    module = mlp_case.module()
    optimizer = mlp_case.optimizer(module)
    state, inputs, stop = module.checkpoint_state, mlp_case.train_inputs(0), threading.Event()

    def train() -> None:
        while not stop.is_set():
            with state.training_state.lock:  # one step and its record of step number and parameters
                module(*inputs)
                optimizer.step()
                state.properties["step"] = module.training_state.optimizer.step
                state.properties["checksum"] = float(
                    sum(p.detach().double().sum() for p in state.training_state.params.values())
                )

    worker = threading.Thread(target=train)
    worker.start()
    try:
        for i in range(20):
            CheckpointState.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
            saved = CheckpointState.load_checkpoint(tmp_path / "ckpt")
            if "step" in saved.properties:
                params = saved.training_state.params.values()
                assert saved.training_state.optimizer.step == saved.properties["step"]
                assert float(sum(p.detach().double().sum() for p in params)) == pytest.approx(
                    saved.properties["checksum"], rel=1e-6
                )
    finally:
        stop.set()
        worker.join(timeout=scaled(60))


def test_failed_step_after_lazy_reset_keeps_the_gradients(mlp_case):
    module = mlp_case.module()
    x, y = mlp_case.train_inputs(0)
    module(x, y)
    grads = {name: p.grad.clone() for name, p in module.training_state.params.items() if p.grad is not None}
    module.lazy_reset_grad()
    with pytest.raises(Exception):
        module(x, np.full_like(y, 10_000))  # class index out of range: the loss fails
    for name, grad in grads.items():
        assert torch.equal(module.training_state.params[name].grad, grad), name


def test_nominal_state_errors_carry_orts_texts(mlp_case):
    state = CheckpointState.load_checkpoint(mlp_case.artifact("nominal_checkpoint"))
    name = mlp_case.param_names[0]
    with pytest.raises(
        NominalStateError, match=r"^Cannot get parameter from a nominal state\. Please load the parameter states first"
    ):
        state.parameters[name].data
    with pytest.raises(
        NominalStateError,
        match=r"^Cannot copy parameter to a nominal state\. Please load all the parameter states first",
    ):
        state.parameters[name] = np.zeros(1, np.float32)


def test_device_name_uses_orts_spelling():
    assert OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32)).device_name() == "Cpu"
    if torch.cuda.is_available():
        assert OrtValue(torch.zeros(2, device="cuda")).device_name() == "Cuda"


def test_onnxruntime_ortvalue_in_gives_onnxruntime_ortvalue_out(mlp_case):
    onnxruntime = pytest.importorskip("onnxruntime")
    module = mlp_case.module()
    inputs = [onnxruntime.OrtValue.ortvalue_from_numpy(value) for value in mlp_case.train_inputs(0)]
    loss = module(*inputs)
    assert isinstance(loss, onnxruntime.OrtValue)
    assert loss.device_name().lower() == "cpu"
    np.testing.assert_allclose(loss.numpy(), mlp_case.expected["train"]["losses"][0], rtol=1e-5)
