"""Module(recompute=...): the same losses and gradients as without recomputation, less saved activation memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from ort_torch_train.api import Module, Optimizer
from ort_torch_train.training.recompute import checkpoint_ranges
from tests.helpers.corpus import Case, loss_of
from tests.helpers.paths import FIXTURES


def _losses_grads_saved(case: Case, recompute, steps: int = 1):
    module = Module(case.artifact("training_model.onnx"), case.load_state(), recompute=recompute)
    torch.manual_seed(0)  # dropout draws the same masks in every run
    losses = [loss_of(module(*case.train_inputs(s))) for s in range(steps)]
    grads = {n: p.grad.numpy().copy() for n, p in module.training_state.params.items() if p.requires_grad}
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    inputs = [torch.from_numpy(a) for a in case.train_inputs(0)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module.train_graph(inputs, [module.training_state.params[n] for n in module.train_layout.params])
    return losses, grads, sum(storages.values())


@pytest.mark.parametrize("name", ["transformer", "bn_dropout"])
@pytest.mark.parametrize("recompute", [2, True])
def test_recompute_gives_the_same_losses_and_gradients(name, recompute):
    case = Case(FIXTURES / name)
    losses, grads, saved = _losses_grads_saved(case, None)
    r_losses, r_grads, r_saved = _losses_grads_saved(case, recompute)
    np.testing.assert_allclose(r_losses, losses, rtol=0, atol=1e-6)
    for n, grad in grads.items():
        np.testing.assert_allclose(r_grads[n], grad, rtol=0, atol=1e-6, err_msg=n)
    if recompute == 2:  # only the segments' inputs are kept for backward (many tiny segments keep more)
        assert r_saved < saved


def test_recompute_setting_errors():
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    for bad in (0, -1, "layers", 1.5):
        with pytest.raises(ValueError, match="recompute"):
            Module(case.artifact("training_model.onnx"), case.load_state(), recompute=bad)


@pytest.mark.compile
def test_recompute_with_compile_compiles_the_checkpointed_forward():
    """torch.func.grad (the one-graph compiled step) refuses checkpoint's saved-tensor hooks, so with
    recompute the forward is compiled on its own and AOTAutograd recomputes its segments in backward."""
    case = Case(FIXTURES / "transformer")
    counters.clear()
    runs = {}
    for recompute, compile in ((None, False), (2, True)):
        module = Module(case.artifact("training_model.onnx"), case.load_state(), recompute=recompute, compile=compile)
        optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
        losses = [loss_of(module.step(optimizer, *case.train_inputs(s))) for s in range(3)]
        runs[compile] = losses, {n: p.detach().numpy().copy() for n, p in module.training_state.params.items()}
    assert counters["stats"]["unique_graphs"] == 1  # the train forward, once
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=0, atol=1e-6)
    for name, value in runs[False][1].items():
        np.testing.assert_allclose(runs[True][1][name], value, rtol=0, atol=1e-6, err_msg=name)


def test_checkpointed_ranges_leave_the_other_ops_in_the_graph():
    """A range becomes one checkpointed submodule reading what it needs from before it (an attribute read
    inside again); the ops outside stay in the graph, so a sharded run can still cut them by layer."""

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("shift", torch.tensor(0.5))

        def forward(self, x, w1, w2, w3):
            h = torch.tanh(x @ w1)
            h = torch.sin(h @ w2) + self.shift
            return (h @ w3).sum()

    module = torch.fx.symbolic_trace(Chain())
    ops = [node for node in module.graph.nodes if node.op not in ("placeholder", "output", "get_attr")]
    torch.manual_seed(0)
    args = [torch.randn(3, 4, requires_grad=True), *(torch.randn(4, 4, requires_grad=True) for _ in range(3))]
    expected = module(*args)
    expected.backward()
    grads = [a.grad.clone() for a in args]
    for a in args:
        a.grad = None
    recomputed = checkpoint_ranges(module, ops, [(2, 4)])  # sin(h @ w2) + shift
    top = [node for node in recomputed.graph.nodes if node.op in ("call_function", "call_method", "call_module")]
    assert [node.op for node in top] == [
        "call_function",
        "call_function",
        "call_module",
        "call_function",
        "call_method",
    ]
    assert top[2].target == "recomputed_0" and [arg.name for arg in top[2].args] == ["tanh", "w2"]
    inner = recomputed.get_submodule("recomputed_0").segment  # run under checkpoint
    assert [node.op for node in inner.graph.nodes].count("get_attr") == 1
    result = recomputed(*args)
    result.backward()
    assert torch.equal(result, expected)
    for arg, grad in zip(args, grads):
        assert torch.equal(arg.grad, grad)
