"""Compiled steps of graphs with data-dependent sizes: Mixture-of-Experts routing (NonZero/Where, Gather,
index_add over the tokens each expert gets, none included) and DINOv2's bicubic Resize compile in one graph,
with no fallback, and train as eager does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

transformers = pytest.importorskip("transformers")
from tests.helpers.moe_models import VOCAB, Dinov2Logits, experts_reached, tiny_moe  # noqa: E402
from tests.helpers.one_graph import assert_one_graph_like_eager, train_counting_graphs  # noqa: E402

pytestmark = [pytest.mark.compile, pytest.mark.slow, pytest.mark.filterwarnings("ignore")]
STEPS, SHAPE, EXPERTS = 5, (2, 8), 3  # 3 experts: each one a batch reaches is a block of the graph


def _export(model: torch.nn.Module, example: torch.Tensor, directory: Path, name: str) -> None:
    generate_artifacts(
        model,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        example_inputs=(example,),
        input_names=[name],
    )


REFUSED = ("runs uncompiled", "fixed shapes")  # no fallback of any kind


def _token_batches(tokens: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [(t, rng.integers(0, VOCAB, t.size)) for t in tokens]


def _reaching_every_expert(model: torch.nn.Module, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    found = []
    while len(found) < count:
        tokens = rng.integers(0, VOCAB, SHAPE)
        if len(experts_reached(model, torch.from_numpy(tokens))) == EXPERTS:
            found.append(tokens)
    return found


def test_mixtral_as_transformers_routes_it_compiles_in_one_graph_and_trains_like_eager(tmp_path, caplog):
    """transformers' loop over the experts a batch reaches, unrolled by the export: every batch reaches all."""
    model = tiny_moe("mixtral", experts=EXPERTS)
    tokens = _reaching_every_expert(model, STEPS)
    _export(model, torch.from_numpy(tokens[0]), tmp_path, "tokens")
    assert_one_graph_like_eager(tmp_path, _token_batches(tokens), caplog, REFUSED)


def test_olmoe_with_an_expert_no_token_reaches_compiles_in_one_graph_and_trains_like_eager(tmp_path, caplog):
    """The loop over every expert: a batch of one repeated token reaches 2 of the 3 experts (the third
    selects 0 tokens), the other batches reach all 3."""
    model = tiny_moe("olmoe", every_expert=True, experts=EXPERTS)
    every = _reaching_every_expert(model, 3)
    repeated = [np.full(SHAPE, 5), np.full(SHAPE, 11)]
    for tokens in repeated:
        assert len(experts_reached(model, torch.from_numpy(tokens))) < EXPERTS
    tokens = [every[0], repeated[0], every[1], repeated[1], every[2]]
    _export(model, torch.from_numpy(tokens[0]), tmp_path, "tokens")
    assert_one_graph_like_eager(tmp_path, _token_batches(tokens), caplog, REFUSED)


def test_mixtral_with_dynamic_shapes_and_an_expert_no_token_reaches_compiles_in_one_graph(tmp_path, caplog):
    """Mixtral routed over every expert, batch and length dynamic: the zeros the experts add their tokens
    to follow batch x length, and the sizes read from each expert's token count are declared to torch,
    so that new batch sizes, batch 1, longer lengths and a batch leaving an expert empty reuse the first
    graph.
    Traced by Dynamo and AOT autograd (backend "aot_eager"): the graph count is asserted, and the losses
    and parameters against eager's."""
    model = tiny_moe("mixtral", every_expert=True, experts=EXPERTS)
    rng = np.random.default_rng(0)
    shapes = [(4, 16), (4, 16), (3, 16), (4, 9), (1, 23), (2, 16), (4, 31), (3, 7)]  # batch x length per step
    tokens = [rng.integers(0, VOCAB, shape) for shape in shapes]
    tokens[3] = np.full(shapes[3], 5)
    assert len(experts_reached(model, torch.from_numpy(tokens[3]))) < EXPERTS
    generate_artifacts(
        model,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.from_numpy(tokens[0]),),
        input_names=["tokens"],
        dynamic_axes={"tokens": {0: "batch", 1: "sequence"}},
    )
    batches = _token_batches(tokens)
    refused = (*REFUSED, "stays fixed", " up to ")
    eager_losses, eager_parameters, _ = train_counting_graphs(tmp_path, batches, False, caplog, refused)
    losses, parameters, graphs = train_counting_graphs(tmp_path, batches, {"backend": "aot_eager"}, caplog, refused)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)


def test_dinov2_compiles_in_one_graph_and_trains_like_eager(tmp_path, caplog):
    """The bicubic Resize of the position embeddings reads its constant sizes at conversion."""
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((2, 3, 16, 16), dtype=np.float32), rng.integers(0, 3, 2)) for _ in range(STEPS)]
    _export(Dinov2Logits(), torch.from_numpy(batches[0][0]), tmp_path, "pixels")
    assert_one_graph_like_eager(tmp_path, batches, caplog, REFUSED)
