"""A step torch.compile cannot compile runs uncompiled, with a WARNING, and is not tried again: not in this
process, and not in the next one that shares its compile cache."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.torch_internals import compile_counters
from ort_torch_train.training.compile import fallbacks
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.cache_store import CacheStore
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
    fallbacks._REMEMBERED.clear()
    _losses(mlp_case, {"backend": failing_backend}, cache=tmp_path)
    assert len(BACKEND_CALLS) == tried


class _Tagger(nn.Module):
    """Token embedding -> LSTM -> mean over time -> linear (batch and sequence axes dynamic)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 2)
        self.lstm = nn.LSTM(2, 2, batch_first=True)
        self.head = nn.Linear(2, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0].mean(1))


def test_a_fixed_shape_fallback_is_recalled_by_every_conversion_of_the_graph_and_from_the_cache(tmp_path):
    """The conversions of one graph for two batch sizes share the key a fixed-shape fallback is kept under
    (their code differs in size literals only); another model's does not. A recorded fallback is found in
    this process and, by a new process, in the compile cache."""
    torch.manual_seed(0)
    generate_artifacts(
        _Tagger(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "lstm",
        example_inputs=(torch.randint(0, 12, (2, 3)),),
        input_names=["tokens"],
        dynamic_axes={"tokens": {0: "batch", 1: "sequence"}},
    )
    module = Module(
        tmp_path / "lstm" / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "lstm" / "checkpoint")
    )
    graph, params = module._engine.train_graph, module._engine._train_params
    keys = []
    for rows in (3, 4):
        tokens = torch.randint(0, 12, (rows, 3))
        converted = graph.specialised(
            [tokens, torch.zeros(rows, dtype=torch.int64)], params, rows, graph.compiled_module
        )
        keys.append(fallbacks.structure_key(converted, ("parts",), ((0, 1),)))
    assert keys[0] == keys[1]
    assert fallbacks.structure_key(converted, ("other parts",), ((0, 1),)) != keys[0]
    cache = CompileCache(CacheStore(tmp_path / "cache"))
    fallbacks.remember(fallbacks.FIXED, keys[0], "specialized it to be a constant (3)", cache)
    assert fallbacks.recalled(fallbacks.FIXED, keys[1], None) == "specialized it to be a constant (3)"
    fallbacks._REMEMBERED.clear()  # a new process: only the cache knows
    assert fallbacks.recalled(fallbacks.FIXED, keys[1], None) is None
    assert fallbacks.recalled(fallbacks.FIXED, keys[1], CompileCache(CacheStore(tmp_path / "cache"))) == (
        "specialized it to be a constant (3)"
    )


@pytest.mark.compile
def test_a_remembered_fixed_shape_fallback_costs_one_graph_per_new_shape(tmp_path, caplog):
    """torch specialises the LSTM's time loop: the first shape traces the dynamic step once, then compiles
    it for fixed shapes; every later shape (new lengths, new batch sizes) compiles one graph, for fixed
    shapes at once. Dynamo's own backend: the graphs are counted, not compiled by inductor."""
    torch.manual_seed(0)
    generate_artifacts(
        _Tagger(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randint(0, 12, (2, 3)),),
        input_names=["tokens"],
        dynamic_axes={"tokens": {0: "batch", 1: "sequence"}},
    )
    torch._dynamo.reset()
    compile_counters().clear()
    fallbacks._REMEMBERED.clear()
    module = Module(
        tmp_path / "training_model.onnx",
        CheckpointState.load_checkpoint(tmp_path / "checkpoint"),
        compile={"backend": "eager"},
        compile_cache=False,
    )
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    graphs = []
    with caplog.at_level(logging.INFO, logger="ort_torch_train"):
        for rows, length in [(3, 3), (3, 4), (3, 5), (4, 4), (5, 6)]:
            module.step(optimizer, rng.integers(0, 12, (rows, length)), rng.integers(0, 3, rows))
            graphs.append(compile_counters()["stats"]["unique_graphs"])
    assert graphs == [2, 3, 4, 5, 6]
    assert sum("remembered from an earlier compilation" in r.getMessage() for r in caplog.records) == 4
