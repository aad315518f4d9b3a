"""A step torch.compile cannot compile runs uncompiled, with a WARNING, and is not tried again: not in this
process, and not in the next one that shares its compile cache."""

from __future__ import annotations

import logging
from pathlib import Path

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
from ort_torch_train.training.dynamic_shapes import DynamicAxes, Follower
from ort_torch_train.training.meta_keys import DYNAMIC_AXES
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
    # a new Module of the same model in this process does not try again, and says so at INFO only
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ort_torch_train"):
        again, _ = _losses(mlp_case, {"backend": failing_backend})
    assert len(BACKEND_CALLS) == tried
    assert any("remembered from an earlier compilation" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert again == losses
    # the next process, sharing the compile cache, finds the fallback there
    fallbacks._REMEMBERED.clear()
    _losses(mlp_case, {"backend": failing_backend}, cache=tmp_path)
    assert len(BACKEND_CALLS) == tried


@pytest.mark.compile
def test_a_step_that_cannot_compile_is_not_tried_again_at_a_new_shape(tmp_path, caplog):
    """A graph whose step torch.compile cannot compile, trained at a new shape every step: the first
    shape tries (and warns), every later conversion recalls the fallback for the graph, whatever its
    sizes, and tries nothing."""
    directory = _tagger_artifacts(tmp_path / "lstm")
    rng = np.random.default_rng(0)
    shapes = [(2, 3), (2, 4), (3, 5), (4, 6), (1, 7)]
    batches = [(rng.integers(0, 12, shape), rng.integers(0, 3, shape[0])) for shape in shapes]
    eager_losses, _ = _train(directory, batches, False)
    _new_process()
    BACKEND_CALLS.clear()
    _train(directory, batches[:1], {"backend": failing_backend})
    tried = len(BACKEND_CALLS)
    _new_process()
    BACKEND_CALLS.clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ort_torch_train"):
        losses, _ = _train(directory, batches, {"backend": failing_backend})
    assert len(BACKEND_CALLS) == tried
    said = [r for r in caplog.records if "runs uncompiled (eager)" in r.getMessage()]
    assert [r.levelno for r in said][:1] == [logging.WARNING]
    assert all(r.levelno == logging.INFO and "remembered" in r.getMessage() for r in said[1:])
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)


class _Tagger(nn.Module):
    """Token embedding -> LSTM -> mean over time -> linear (batch and sequence axes dynamic)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 2)
        self.lstm = nn.LSTM(2, 2, batch_first=True)
        self.head = nn.Linear(2, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0].mean(1))


def test_the_specialised_axes_are_recalled_by_every_conversion_of_the_graph_and_from_the_cache(tmp_path):
    """The conversions of one graph for batch 2 and for batch 3 (batch and length dynamic in both: the
    LSTM's zero state is rebuilt at the batch size) share the key the axes torch specialised are kept
    under; another step's parts do not. The axes are found in this
    process and, by a new process, in the compile cache."""
    directory = _tagger_artifacts(tmp_path / "lstm")
    module = Module(directory / "training_model.onnx", CheckpointState.load_checkpoint(directory / "checkpoint"))
    graph, params = module._engine.train_graph, module._engine._train_params
    keys, axes = [], []
    for rows in (2, 3):
        tokens = torch.randint(0, 12, (rows, 4))
        converted = graph.specialised(
            [tokens, torch.zeros(rows, dtype=torch.int64)], params, rows, graph.compiled_module
        )
        keys.append(fallbacks.structure_key(converted, ("parts",)))
        axes.append(DYNAMIC_AXES.get(converted, ()))
    assert axes == [((0, 0), (1, 0), (0, 1))] * 2
    assert keys[0] == keys[1]
    assert fallbacks.structure_key(converted, ("other parts",)) != keys[0]
    cache = CompileCache(CacheStore(tmp_path / "cache"))
    length = fallbacks.Specialised(frozenset({(0, 1)}), "specialized it to be a constant (3)")
    assert fallbacks.remember_axes(keys[0], length, cache) == length
    assert fallbacks.recalled_axes(keys[1], None) == length
    assert length.fixed(axes[1]) == ((0, 1),)
    fallbacks._REMEMBERED.clear()  # a new process: only the cache knows
    assert fallbacks.recalled_axes(keys[1], None) is None
    assert fallbacks.recalled_axes(keys[1], CompileCache(CacheStore(tmp_path / "cache"))) == length
    # more axes specialised later add to them; an error naming none fixes every axis
    batch = fallbacks.Specialised(frozenset({(0, 0)}), "specialized it to be a constant (2)")
    assert fallbacks.remember_axes(keys[0], batch, cache).axes == {(0, 0), (0, 1)}
    assert fallbacks.remember_axes(keys[0], fallbacks.Specialised(None, "numel"), cache).fixed(axes[1]) == axes[1]


def test_fixing_specialised_axes_keeps_the_other_groups_and_their_followers():
    """T5's axes: batch, length (a table cut to it: up to 8) and the labels, batch x length. With the length
    fixed the labels follow the batch, 8 per row; a group with one axis fixed is fixed whole (its axes
    share one size in the graph); a fixed follower is dropped."""
    axes = DynamicAxes((((0, 0),), ((0, 1),)), (Follower((1, 0), 1, (0, 1)),), ((1, 8),))
    kept = axes.without({(0, 1)}, [(2, 8), (16,)])
    assert kept == DynamicAxes((((0, 0),),), (Follower((1, 0), 8, (0,)),))
    assert kept.axes == ((0, 0), (1, 0))
    assert axes.without({(1, 0)}, [(2, 8), (16,)]) == DynamicAxes(axes.groups, (), axes.largest)
    assert DynamicAxes((((0, 0), (1, 0)),)).without({(1, 0)}, [(3,), (3,)]) == DynamicAxes()


def _tagger_artifacts(directory: Path) -> Path:
    torch.manual_seed(0)
    generate_artifacts(
        _Tagger(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        example_inputs=(torch.randint(0, 12, (2, 3)),),
        input_names=["tokens"],
        dynamic_axes={"tokens": {0: "batch", 1: "sequence"}},
    )
    return directory


def _train(directory: Path, batches: list[tuple], compile, cache=False) -> tuple[list[float], list[int]]:
    """Losses and the Dynamo graphs after each step of one Module (learning rate 1e-3)."""
    module = Module(
        directory / "training_model.onnx",
        CheckpointState.load_checkpoint(directory / "checkpoint"),
        compile=compile,
        compile_cache=cache,
    )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(1e-3)
    losses, graphs = [], []
    for batch in batches:
        losses.append(float(np.asarray(module.step(optimizer, *batch)).reshape(-1)[0]))
        graphs.append(compile_counters()["stats"]["unique_graphs"])
    return losses, graphs


def _new_process() -> None:
    """What a new process starts from: no Dynamo graphs, no fallback remembered in memory."""
    torch._dynamo.reset()
    compile_counters().clear()
    fallbacks._REMEMBERED.clear()
