"""Module against ORT 1.19.2 on every reference case: losses, gradients, accumulation, buffers, names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.corpus import loss_of

LOSS_ATOL = 1e-5


def _grads(case, module) -> dict[str, np.ndarray]:
    return {
        name: p.grad.detach().cpu().numpy().copy()
        for name, p in module.training_state.params.items()
        if p.requires_grad
    }


def _assert_grads(actual: dict, case, key: str) -> None:
    for name in case.trainable_names:
        np.testing.assert_allclose(actual[name], case.arrays[f"{key}__{name}"], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("eval_model", [True, False], ids=["eval-graph", "pruned-training-graph"])
def test_first_step_loss_and_gradients(case, eval_model):
    if not case.deterministic:
        pytest.skip("ORT's training step is random here (dropout)")
    module = case.module(eval_model=eval_model)
    semantics = case.expected["gradient_semantics"]
    assert abs(loss_of(module(*case.train_inputs(0))) - semantics["loss_call1"]) <= LOSS_ATOL
    _assert_grads(_grads(case, module), case, "grad_step1")


def test_gradients_accumulate_until_lazy_reset(case):
    if not case.deterministic:
        pytest.skip("ORT's training step is random here (dropout)")
    module = case.module()
    inputs = case.train_inputs(0)
    module(*inputs)
    first = _grads(case, module)
    module(*inputs)
    accumulated = _grads(case, module)
    _assert_grads(accumulated, case, "grad_accum2")
    for name, grad in accumulated.items():
        np.testing.assert_allclose(grad, 2 * first[name], rtol=1e-6, atol=1e-7)
    module.lazy_reset_grad()  # lazy: the gradients stay until the next train step
    for name, grad in _grads(case, module).items():
        np.testing.assert_array_equal(grad, accumulated[name])
    module(*inputs)
    _assert_grads(_grads(case, module), case, "grad_after_reset")
    for name, grad in _grads(case, module).items():
        np.testing.assert_array_equal(grad, first[name])


def test_frozen_parameters_get_no_gradient(case):
    module = case.module()
    module(*case.train_inputs(0))
    for name, param in module.training_state.params.items():
        trainable = case.expected["parameters"][name]["requires_grad"]
        assert param.requires_grad == trainable
        assert (param.grad is None) == (not trainable)


def test_contiguous_buffers_equal_ort_exactly(case):
    module = case.module()
    for trainable_only, key in [(True, "init_contiguous_trainable"), (False, "init_contiguous_all")]:
        buffer = module.get_contiguous_parameters(trainable_only=trainable_only).numpy()
        np.testing.assert_array_equal(buffer, case.arrays[key])
    sizes = case.expected["parameters_size"]
    assert module.get_parameters_size() == sizes["trainable_only_True"]
    assert module.get_parameters_size(False) == sizes["trainable_only_False"]


def test_copy_buffer_round_trips(case):
    module = case.module()
    buffer = case.arrays["final_contiguous_all"]
    module.copy_buffer_to_parameters(buffer, trainable_only=False)
    np.testing.assert_array_equal(module.get_contiguous_parameters().numpy(), buffer)
    for name in case.param_names:
        np.testing.assert_array_equal(
            module.training_state.params[name].detach().numpy(), case.arrays[f"final__{name}"]
        )


def test_input_and_output_names(case):
    module = case.module()
    train, evaluation = case.expected["train_mode"], case.expected["eval_mode"]
    assert module.train().input_names() == train["input_names"]
    assert module.output_names() == train["output_names"]
    assert module.eval().input_names() == evaluation["input_names"]
    assert module.output_names() == evaluation["output_names"]


def test_torch_inputs_give_torch_outputs_without_copies(case):
    module = case.module()
    inputs = [torch.from_numpy(a) for a in case.eval_inputs()]
    module.eval()
    outputs = module(*inputs)
    first = outputs if isinstance(outputs, torch.Tensor) else outputs[0]
    assert isinstance(first, torch.Tensor) and first.device == module.device
    numpy_outputs = module(*case.eval_inputs())
    expected = numpy_outputs if isinstance(numpy_outputs, np.ndarray) else numpy_outputs[0]
    np.testing.assert_array_equal(first.numpy(), expected)


def test_is_a_pytorch_module(case):
    module = case.module()
    names = {name for name, _ in module.named_parameters()}
    assert names == set(case.param_names)
    state_dict = module.state_dict()
    assert set(state_dict) == set(case.param_names)
    for name, tensor in state_dict.items():
        assert tensor.data_ptr() == module.training_state.params[name].data_ptr()  # no copies
    loss = module.train().forward(*[torch.from_numpy(a) for a in case.train_inputs(0)])
    loss = loss if isinstance(loss, torch.Tensor) else loss[0]
    assert loss.requires_grad == bool(case.trainable_names)
