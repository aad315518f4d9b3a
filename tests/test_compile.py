"""Module(compile=True): forward, backward and the optimizer update through torch.compile."""

from __future__ import annotations

import numpy as np
import torch
from torch._dynamo.utils import counters

STEPS = 6


def _run(case, compile):
    module = case.module() if not compile else _compiled_module(case)
    optimizer = case.optimizer(module)
    losses = []
    for step in range(STEPS):
        optimizer.set_learning_rate(case.lr_before(step) or 1e-3)
        losses.append(float(module(*case.train_inputs(step))))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    return losses, float(module(*case.eval_inputs())), module.get_contiguous_parameters().numpy()


def _compiled_module(case):
    from ort_torch_train.api import Module

    evaluation = case.artifact("eval_model.onnx")
    return Module(case.artifact("training_model.onnx"), case.load_state(), evaluation, compile=True)


def test_compiled_step_matches_eager_without_graph_breaks(mlp_case):
    torch._dynamo.reset()
    counters.clear()
    eager = _run(mlp_case, compile=False)
    compiled = _run(mlp_case, compile=True)
    np.testing.assert_allclose(compiled[0], eager[0], rtol=0, atol=1e-6)
    assert abs(compiled[1] - eager[1]) <= 1e-6
    np.testing.assert_allclose(compiled[2], eager[2], rtol=0, atol=1e-6)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 3  # train forward+backward, optimizer update, eval forward
