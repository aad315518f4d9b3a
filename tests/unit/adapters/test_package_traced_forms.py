"""Converters traced for a package (make_fx at symbolic sizes, as ``training/package/programs.py`` traces a step)
take their traced forms: no host read of a tensor's values, no size read as a number (which fixes its axis), no op
defined in Python; and the traced graph computes what the eager module does, at other sizes too."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ort_torch_train.adapters.dropout import Dropout
from ort_torch_train.adapters.index_checks import wrapped_indices
from ort_torch_train.adapters.lean_cross_entropy import LEAN_FROM_ELEMENTS
from ort_torch_train.adapters.losses import NegativeLogLikelihood
from ort_torch_train.adapters.rnn import Recurrent
from ort_torch_train.adapters.shape_ops import expand_dynamic
from tests.helpers.adapter_harness import convert_model, one_node_model, rand

SEQ, BATCH, INPUT, HIDDEN = 4, 5, 3, 6  # distinct: make_fx gives equal example sizes one symbol


def _traced(function, *example: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(function, tracing_mode="symbolic")(*example)


def _symbolic_axes(traced: torch.fx.GraphModule) -> list[list[bool]]:
    """Per placeholder, whether each axis stayed symbolic: not fixed to its example size while tracing."""
    values = [node.meta["val"] for node in traced.graph.nodes if node.op == "placeholder"]
    return [[_symbolic(size) for size in value.shape] for value in values]


def _symbolic(size: int | torch.SymInt) -> bool:
    return isinstance(size, torch.SymInt) and not statically_known_true(size == size.node.hint)


def _targets(traced: torch.fx.GraphModule) -> set[str]:
    return {str(node.target) for node in traced.graph.nodes if node.op == "call_function"}


def test_an_active_dropout_traces_its_mask_at_a_symbolic_batch():
    dropout = Dropout(active=True, ratio=0.25, with_mask=False)

    def gradient(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.func.grad(lambda w: dropout(x @ w).sum())(w)

    traced = _traced(gradient, torch.ones(4, 3), torch.ones(3, 1000))  # F.dropout raised at symbolic sizes
    assert _symbolic_axes(traced)[0] == [True, True]
    for rows in (4, 7):  # each row adds 1 / 0.75 to a column where it is kept: ``rows`` on average
        assert abs(float(traced(torch.ones(rows, 3), torch.ones(3, 1000)).mean()) / rows - 1) < 0.05


def test_expand_to_a_traced_size_keeps_its_axis():
    traced = _traced(lambda x: expand_dynamic(x, [x.shape[0], 3, 4]), torch.ones(8, 1, 4))
    assert _symbolic_axes(traced)[0][0]  # the size check read it as a number: fixed at 8
    assert traced(torch.ones(2, 1, 4)).shape == (2, 3, 4)


def test_a_large_loss_traces_the_plain_cross_entropy():
    loss = NegativeLogLikelihood("mean", None, from_scores=True, labels_name="labels", lean=True)
    scores = torch.linspace(-3, 3, LEAN_FROM_ELEMENTS).reshape(-1, 2)
    labels = (torch.arange(scores.shape[0]) % 2).long()

    def gradient(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.func.grad(lambda s: loss(s, labels)[0])(scores)

    traced = _traced(gradient, scores, labels)  # the lean loss checked the labels on the host
    assert "aten.nll_loss_forward.default" in _targets(traced)
    leaf = scores.clone().requires_grad_()
    loss(leaf, labels)[0].backward()  # eager: the lean loss
    torch.testing.assert_close(traced(scores, labels), leaf.grad, rtol=1e-5, atol=1e-12)


def test_index_checks_run_in_the_traced_step():
    def gathered(data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return data[wrapped_indices(indices, data.shape[0], "Gather node 'g'", "input 'i'")]

    data, indices = torch.arange(12.0).reshape(6, 2), torch.tensor([0, -1, 3])
    traced = _traced(gathered, data, indices)  # the check read each size as a number: a SymInt is no int
    assert _symbolic_axes(traced)[0] == [True, True]
    assert "aten._assert_async.msg" in _targets(traced)
    torch.testing.assert_close(traced(data, indices), gathered(data, indices), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="Gather node 'g': input 'i' holds a value outside the valid range"):
        traced(data, torch.tensor([6]))


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_a_fused_recurrence_traces_as_the_step_loop_at_a_symbolic_batch(op_type):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op_type]
    inputs = [
        rand(SEQ, BATCH, INPUT, seed=1),
        rand(1, gates * HIDDEN, INPUT, seed=2) * 0.5,
        rand(1, gates * HIDDEN, HIDDEN, seed=3) * 0.5,
        rand(1, 2 * gates * HIDDEN, seed=4) * 0.5,
    ]
    attrs = {"linear_before_reset": 1} if op_type == "GRU" else {}
    outputs = 3 if op_type == "LSTM" else 2
    model = one_node_model(op_type, inputs, outputs=outputs, opset=14, hidden_size=HIDDEN, **attrs)
    gm, tensors = convert_model(model, inputs)
    assert [m for m in gm.modules() if isinstance(m, Recurrent)][0].config.fused

    def gradients(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        def loss(*weights: torch.Tensor) -> torch.Tensor:
            return sum((out * out.detach().cos()).sum() for out in gm(x, *weights))

        return torch.func.grad(loss, argnums=(0, 1, 2))(*weights)

    traced = _traced(gradients, *tensors)  # torch's fused LSTM kernel failed at symbolic sizes
    assert not {target for target in _targets(traced) if "ort_torch_train" in target}  # no op defined in Python
    assert _symbolic_axes(traced)[0] == [False, True, True]  # the loop fixes the length, not the batch
    for x in (tensors[0], torch.from_numpy(rand(SEQ, 2, INPUT, seed=5))):
        for got, expected in zip(traced(x, *tensors[1:]), gradients(x, *tensors[1:]), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
