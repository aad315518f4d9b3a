"""Dynamic shapes: one compiled step for every batch size and sequence length the graph leaves symbolic."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.errors import InputError, ModelError
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.torch_internals import compile_counters
from ort_torch_train.training.compile.precompiled import step_key
from ort_torch_train.training.dynamic_shapes import probe_inputs, probe_size
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.meta_keys import DYNAMIC_AXES
from tests.helpers.timeouts import scaled

VOCAB, HIDDEN, CLASSES = 16, 5, 3


class _Tokens(nn.Module):
    """Classifies token sequences through a reshape to (batch * length, 6) and back: shape arithmetic."""

    def __init__(self, positions: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 6)
        self.positions = positions
        self.hidden = nn.Linear(6, HIDDEN)
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, length = ids.shape
        x = self.embedding(ids)
        if self.positions:  # a position signal: a constant tensor whose every value depends on the length
            x = x + torch.arange(length).unsqueeze(-1) / length
        x = torch.relu(self.hidden(x.reshape(batch * length, 6))).reshape(batch, length, HIDDEN)
        return self.out(x.mean(1))


def _token_artifacts(make_model: Callable[[], nn.Module], directory, vocab: int = VOCAB) -> None:
    """Artifacts of the model ``make_model`` builds after seeding torch with 0 (token ids in, batch and
    sequence axes symbolic), CrossEntropy and AdamW."""
    torch.manual_seed(0)
    generate_artifacts(
        make_model(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        example_inputs=(torch.randint(0, vocab, (4, 8)),),
        dynamic_axes={"ids": {0: "batch", 1: "sequence"}},
    )


@pytest.fixture(scope="session", params=[False, True], ids=["reshapes", "positions"])
def artifacts(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokens")
    _token_artifacts(lambda: _Tokens(request.param), directory)
    return directory, request.param


def _batches(shapes):
    rng = np.random.default_rng(0)
    return [(rng.integers(0, VOCAB, shape), rng.integers(0, CLASSES, shape[0])) for shape in shapes]


def _module(directory, **options) -> Module:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    return Module(directory / "training_model.onnx", state, directory / "eval_model.onnx", **options)


def _trainer(directory, **options) -> tuple[Module, Optimizer]:
    """A new Module and its Optimizer (learning rate 1e-2), torch.compile's caches and counters reset."""
    torch._dynamo.reset()
    compile_counters().clear()
    module = _module(directory, **options)
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(1e-2)
    return module, optimizer


def _engine(module: Module) -> TrainingEngine:
    return module._engine


@pytest.mark.compile
def test_one_compiled_step_trains_on_partial_batches_and_new_lengths_like_eager(artifacts):
    directory, positions = artifacts
    if positions:
        pytest.skip("the positions fix the length (test_a_size_the_graph_needs_as_a_constant_stays_fixed...)")
    batches = _batches([(64, 8), (64, 8), (37, 8), (64, 12), (1, 20), (37, 20), (1, 7)])  # batch 1: no graph of its own
    losses, evaluations = {}, {}
    for compile in (False, True):
        module, optimizer = _trainer(directory, compile=compile)
        losses[compile] = [float(module.step(optimizer, *batch)) for batch in batches]
        trained_graphs = compile_counters()["stats"]["unique_graphs"]
        module.eval()
        evaluations[compile] = [module(*batch) for batch in batches[2:5]]
    assert trained_graphs == 1  # one train step for every shape
    assert compile_counters()["stats"]["unique_graphs"] == 2  # and one eval graph
    np.testing.assert_allclose(losses[True], losses[False], rtol=0, atol=1e-6)
    assert len(set(losses[True])) == len(batches)
    for compiled, eager in zip(evaluations[True], evaluations[False], strict=True):
        np.testing.assert_allclose(compiled, eager, rtol=0, atol=1e-6)


class _WideTokens(nn.Module):
    """Token sequences through a linear on 3-d activations large enough to run on oneDNN."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 512)
        self.hidden = nn.Linear(512, 512)
        self.out = nn.Linear(512, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embedding(ids))).mean(1))


@pytest.mark.compile
def test_linears_sent_to_onednn_keep_their_rows_dynamic(tmp_path):
    _token_artifacts(_WideTokens, tmp_path)
    batches = _batches([(64, 8), (37, 8), (64, 12)])
    module, _, _ = _generalised(tmp_path, batches[0])
    assert FUSIONS.get(module, Counter())["onednn_linear"] == 1  # the hidden layer, on 3-d activations
    losses = {}
    for compile in (False, True):
        module, optimizer = _trainer(tmp_path, compile=compile)
        losses[compile] = [float(module.step(optimizer, *batch)) for batch in batches]
    assert compile_counters()["stats"]["unique_graphs"] == 1
    np.testing.assert_allclose(losses[True], losses[False], rtol=0, atol=1e-5)


class _FlatLabelsLM(nn.Module):
    """A language model whose logits, and so its labels, are flattened to batch x sequence rows. Its
    ``kind`` of positions: none ("tokens"), learned embeddings looked up at ``arange(length)`` as
    GPT-2's ("positions"), or a cosine table of the positions as rotary embeddings' ("table")."""

    def __init__(self, kind: str = "tokens") -> None:
        super().__init__()
        self.kind = kind
        self.embedding = nn.Embedding(VOCAB, 6)
        self.positions = nn.Embedding(32, 6) if kind == "positions" else None
        self.hidden = nn.Linear(6, HIDDEN)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.shape[1]).unsqueeze(0))
        if self.kind == "table":
            x = x * torch.cos(torch.arange(ids.shape[1]).unsqueeze(-1) / torch.arange(1, 7))
        return self.out(torch.relu(self.hidden(x))).reshape(-1, VOCAB)


@pytest.fixture(scope="session", params=["tokens", "positions", "table"])
def flat_labels_artifacts(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("flat_labels")
    _token_artifacts(lambda: _FlatLabelsLM(request.param), directory)
    return directory, request.param


def _lm_batches(shapes):
    rng = np.random.default_rng(0)
    return [(rng.integers(0, VOCAB, shape), rng.integers(0, VOCAB, shape[0] * shape[1])) for shape in shapes]


def test_flattened_labels_follow_the_batch_and_sequence_axes(flat_labels_artifacts, caplog):
    directory, kind = flat_labels_artifacts
    caplog.set_level(logging.INFO, logger="ort_torch_train")
    module, graph, params = _generalised(directory, _lm_batches([(64, 8)])[0])
    assert DYNAMIC_AXES.get(module, None) == ((0, 0), (0, 1), (1, 0))
    assert "axis 0 of 'labels' follows them" in caplog.text
    assert "stay fixed" not in caplog.text
    # a table computed from the positions runs at run time: it serves longer sequences too
    assert "(up to" not in caplog.text
    inputs = [torch.as_tensor(value) for value in _lm_batches([(37, 12)])[0]]
    with torch.no_grad():
        expected = graph.eager_module(graph._convert(inputs, params), params[0].device)(*inputs, *params)
        actual = module(*inputs, *params)
    for a, b in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("rows", "probed"), [(4, 3), (2, 3)])
def test_a_probe_changes_a_group_and_its_followers_by_one_factor(rows, probed):
    ids, labels = torch.arange(rows * 5).reshape(rows, 5), torch.arange(rows * 5)
    grown_ids, grown_labels = probe_inputs([ids, labels], ((0, 0),), ((1, 0),))
    assert probe_size(rows) == probed
    assert grown_ids.shape == (probed, 5) and grown_labels.shape == (probed * 5,)
    torch.testing.assert_close(grown_ids[: min(rows, probed)], ids[: min(rows, probed)])
    torch.testing.assert_close(grown_labels, torch.arange(rows * 5).repeat(2)[: probed * 5])


_PROBE_PEAK_SCRIPT = """
import itertools, sys
import numpy as np, torch
from ort_torch_train.api import CheckpointState, Module
from tests.helpers.step_peak import step_peak_growth_mb
directory = sys.argv[1]
rng = np.random.default_rng(0)
inputs = [torch.as_tensor(rng.integers(0, 2048, (32, 63))), torch.as_tensor(rng.integers(0, 2048, 32 * 63))]
growth = []
for dynamic in (False, True):
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    engine = Module(directory + "/training_model.onnx", state, dynamic=dynamic)._engine
    graph, params, variants = engine.train_graph, engine._train_params, itertools.count()
    growth.append(step_peak_growth_mb(lambda: graph.specialised(inputs, params, next(variants), graph.compiled_module)))
print(growth[0])
print(growth[1])
"""


class _WideVocabLM(_FlatLabelsLM):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(2048, 6)
        self.out = nn.Linear(HIDDEN, 2048)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embedding(ids)))).reshape(-1, 2048)


def test_probing_the_sizes_peaks_no_higher_than_converting_for_fixed_shapes(tmp_path):
    """A probe that fails (the batch alone, without its labels) frees its values before the next runs."""
    _token_artifacts(_WideVocabLM, tmp_path, vocab=2048)
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(Path(__file__).parents[3])}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE_PEAK_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        env=environment,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    fixed_mb, dynamic_mb = map(float, out.stdout.split()[-2:])
    # the logits alone: 2016 rows x 2048 classes, 15.75 MiB (under the lean loss's 2**22 scores, where
    # log_softmax + nll_loss keep their log-probabilities too)
    assert fixed_mb > 15.75, (fixed_mb, dynamic_mb)
    assert dynamic_mb <= fixed_mb * 1.1 + 2


@pytest.mark.compile
def test_one_compiled_step_trains_a_language_model_with_flattened_labels_like_eager(flat_labels_artifacts):
    """One step for every shape (with a table computed from the positions: at every length)."""
    directory, _ = flat_labels_artifacts
    batches = _lm_batches([(64, 12), (64, 12), (37, 8), (64, 8), (37, 16)])
    rng = np.random.default_rng(1)
    losses, evaluations = {}, {}
    for compile in (False, True):
        module, optimizer = _trainer(directory, compile=compile)
        losses[compile] = [float(module.step(optimizer, *batch)) for batch in batches]
        with pytest.raises(ModelError, match=r"Expected input batch_size \(296\) to match target batch_size \(300\)"):
            module.step(optimizer, rng.integers(0, VOCAB, (37, 8)), rng.integers(0, VOCAB, 300))
        trained_graphs = compile_counters()["stats"]["unique_graphs"]
        module.eval()
        evaluations[compile] = [module(*batch) for batch in batches[2:]]
    assert trained_graphs == 1
    assert compile_counters()["stats"]["unique_graphs"] == 2  # and one eval graph
    np.testing.assert_allclose(losses[True], losses[False], rtol=0, atol=1e-6)
    np.testing.assert_allclose(evaluations[True], evaluations[False], rtol=0, atol=1e-6)


def test_eager_training_converts_three_times_for_every_batch_size_and_length(artifacts, caplog):
    """The first two shapes are converted as they are, the third generalised: later shapes convert nothing."""
    directory, positions = artifacts
    batches = _batches([(64, 8), (64, 8), (37, 8), (64, 12), (64, 20), (37, 20), (64, 8)])
    losses = {}
    for dynamic in (False, True):
        caplog.clear()
        caplog.set_level(logging.INFO, logger="ort_torch_train.training.forward_graph")
        module, optimizer = _trainer(directory, dynamic=dynamic)
        losses[dynamic] = [float(module.step(optimizer, *batch)) for batch in batches]
        conversions = caplog.text.count("specialising the training graph")
    assert losses[True] == losses[False]
    # the positions fix the length: generalised at (64, 12) for every batch size, (64, 20) and (37, 20) convert
    assert conversions == (5 if positions else 3)


def _generalised(directory, inputs, **options):
    """The train graph's module prepared for compilation at ``inputs``' shapes, as a compiled step gets it."""
    engine = _engine(_module(directory, **options))
    graph, params = engine.train_graph, engine._train_params
    tensors = [torch.as_tensor(value) for value in inputs]
    return graph.specialised(tensors, params, "test", graph.compiled_module), graph, params


@pytest.mark.parametrize("shape", [(37, 8), (64, 12), (3, 2)])
def test_a_generalised_graph_computes_what_a_graph_converted_for_the_new_shape_does(artifacts, shape):
    directory, positions = artifacts
    if positions:
        pytest.skip("the positions fix the length")
    (first,) = _batches([(64, 8)])
    module, graph, params = _generalised(directory, first)
    assert DYNAMIC_AXES.get(module, None) == ((0, 0), (1, 0), (0, 1))
    inputs = [torch.as_tensor(value) for value in _batches([shape])[0]]
    with torch.no_grad():
        expected = graph.eager_module(graph._convert(inputs, params), params[0].device)(*inputs, *params)
        actual = module(*inputs, *params)
    for a, b in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_size_the_graph_needs_as_a_constant_stays_fixed_with_the_reason_logged(artifacts, caplog):
    directory, positions = artifacts
    if not positions:
        pytest.skip("only the positions fix the length")
    caplog.set_level(logging.INFO, logger="ort_torch_train.training.dynamic_shapes")
    module, _, _ = _generalised(directory, _batches([(64, 8)])[0])
    assert DYNAMIC_AXES.get(module, None) == ((0, 0), (1, 0))  # the batch axes
    assert "axis 1 of 'ids' stays fixed at 8" in caplog.text
    assert "depends on it" in caplog.text


def test_dynamic_false_and_a_chosen_axis(artifacts):
    directory, _ = artifacts
    batch = _batches([(64, 8)])[0]
    assert DYNAMIC_AXES.get(_generalised(directory, batch, dynamic=False)[0], None) is None
    chosen = _generalised(directory, batch, dynamic={"ids": [0], "labels": [-1]})[0]
    assert DYNAMIC_AXES.get(chosen, None) == ((0, 0), (1, 0))


def test_the_dynamic_setting_is_checked(artifacts):
    directory, _ = artifacts
    with pytest.raises(ValueError, match="dynamic: expected a bool or a dict"):
        _module(directory, dynamic="yes")
    with pytest.raises(InputError, match="'tokens' is not a user input"):
        _module(directory, dynamic={"tokens": [0]})
    with pytest.raises(InputError, match="input 'ids' has 2 axes, got axis 2"):
        _module(directory, dynamic={"ids": [2]})


_CACHED_TRAINING = """
import logging, sys
import numpy as np
from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.training.compile.cache import load_compile_cache, save_compile_cache
logging.basicConfig(level=logging.INFO)
directory, cache, rows, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
load_compile_cache(cache)
state = CheckpointState.load_checkpoint(directory + "/checkpoint")
module = Module(directory + "/training_model.onnx", state, compile=True)
optimizer = Optimizer(directory + "/optimizer_model.onnx", module)
rng = np.random.default_rng(0)
print(float(module.step(optimizer, rng.integers(0, 16, (rows, length)), rng.integers(0, 3, rows))))
save_compile_cache(cache)
"""


@pytest.mark.compile
@pytest.mark.slow
def test_a_saved_dynamic_step_loads_in_a_process_whose_first_batch_has_other_sizes(artifacts, tmp_path):
    directory, positions = artifacts
    if positions:
        pytest.skip("one model is enough")
    cache = tmp_path / "compile.cache"

    def train(rows: int, length: int) -> str:
        command = [sys.executable, "-c", _CACHED_TRAINING, str(directory), str(cache), str(rows), str(length)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=scaled(600))
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stderr

    assert "loaded the saved train step" not in train(64, 8)
    assert "loaded the saved train step" in train(37, 12)


def test_a_dynamic_step_is_keyed_without_its_dynamic_sizes(artifacts):
    """Generalised at other first sizes, the graph is the same, and so is its precompiled step's key."""
    directory, positions = artifacts
    if positions:
        pytest.skip("one model is enough")
    keys = []
    for shape in ((64, 8), (37, 12)):
        inputs = [torch.as_tensor(value) for value in _batches([shape])[0]]
        module = _generalised(directory, inputs)[0]
        axes = DYNAMIC_AXES.get(module, ())
        keys.append((step_key(module, ("adamw",), inputs, axes), step_key(module, ("adamw",), inputs)))
    assert keys[0][0] == keys[1][0]
    assert keys[0][1] != keys[1][1]  # a fixed-shape key names the sizes
