"""A step torch.compile cannot compile runs uncompiled, with a WARNING, and is not tried again: not in this
process, and not in the next one that shares its compile cache."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from ort_torch_train.api import Module, Optimizer
from ort_torch_train.torch_internals import compile_counters
from tests.helpers.corpus import Case

STEPS = 3
BACKEND_CALLS: list[int] = []


def failing_backend(graph_module, example_inputs):
    """A torch.compile backend that compiles nothing: Dynamo raises BackendCompilerFailed."""
    BACKEND_CALLS.append(len(graph_module.graph.nodes))
    raise RuntimeError("this backend compiles nothing")


def _losses(case: Case, compile, cache=False) -> tuple[list[float], np.ndarray]:
    module = Module(
        case.artifact("training_model.onnx"),
        case.load_state(),
        case.artifact("eval_model.onnx"),
        compile=compile,
        compile_cache=cache,
    )
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    losses = []
    for step in range(STEPS):
        optimizer.set_learning_rate(case.lr_before(step) or 1e-3)
        losses.append(float(np.asarray(module.step(optimizer, *case.train_inputs(step))).reshape(-1)[0]))
    return losses, module.get_contiguous_parameters().numpy()


@pytest.mark.compile
def test_a_step_that_cannot_compile_runs_eagerly_once_warned_and_is_remembered(mlp_case, caplog, tmp_path):
    torch._dynamo.reset()
    compile_counters().clear()
    eager_losses, eager_parameters = _losses(mlp_case, False)
    BACKEND_CALLS.clear()
    with caplog.at_level(logging.WARNING, logger="ort_torch_train"):
        losses, parameters = _losses(mlp_case, {"backend": failing_backend}, cache=tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "runs uncompiled (eager)" in r.getMessage()]
    assert len(warnings) == 1 and "this backend compiles nothing" in warnings[0]
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)
    tried = len(BACKEND_CALLS)
    assert tried >= 1
    # a new Module of the same model in this process does not try again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ort_torch_train"):
        again, _ = _losses(mlp_case, {"backend": failing_backend})
    assert len(BACKEND_CALLS) == tried
    assert any("remembered from an earlier compilation" in r.getMessage() for r in caplog.records)
    assert again == losses
    # the next process, sharing the compile cache, finds the fallback there
    from ort_torch_train.training.compile import fallbacks

    fallbacks._REMEMBERED.clear()
    _losses(mlp_case, {"backend": failing_backend}, cache=tmp_path)
    assert len(BACKEND_CALLS) == tried
