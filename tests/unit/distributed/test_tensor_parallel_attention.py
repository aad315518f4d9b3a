"""Tensor parallel's attention blocks without ranks: the blocks and heads found in exported training
graphs, and the reshape of a rank's heads (the runs on gloo ranks are in
tests/integration/test_tensor_parallel.py)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

from ort_torch_train.distributed.tensor_parallel import small_constants
from ort_torch_train.distributed.tensor_parallel_attention import ReshapeLocalHeads, find_attention_blocks
from ort_torch_train.errors import ModelError
from ort_torch_train.graph.layout import forward_graph, training_layout
from ort_torch_train.state.training_state import TrainingState
from tests.helpers.attention_model import make_attention_fixture
from tests.unit.distributed.test_tensor_parallel import artifacts


def blocks_of(folder: Path, taken: set[str] = frozenset()) -> list[tuple]:  # type: ignore[assignment]
    model = onnx.load(folder / "artifacts" / "training_model.onnx")
    state = TrainingState.load(folder / "artifacts" / "checkpoint")
    shapes = {name: tuple(param.shape) for name, param in state.params.items()}
    graph = forward_graph(model, training_layout(model, shapes), initializers=False)
    found = find_attention_blocks(graph, shapes, set(taken), small_constants(model, shapes))
    return [
        (tuple(c.weight for c in b.columns), b.row.weight, tuple(c.bias for c in b.columns), b.heads) for b in found
    ]


@pytest.fixture(scope="module")
def attention_models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("attention_models")
    return {heads: make_attention_fixture(root / str(heads), hidden=12, heads=heads) for heads in (2, 3)}


@pytest.mark.parametrize("heads", [2, 3])
def test_the_projections_and_the_heads_of_an_exported_attention(attention_models: dict, heads: int) -> None:
    projections = ("block.query.weight", "block.key.weight", "block.value.weight")
    biases = ("block.query.bias", "block.key.bias", "block.value.bias")
    assert blocks_of(attention_models[heads]) == [(projections, "block.output.weight", biases, heads)]


def test_a_projection_taken_by_a_pair_or_a_packed_projection_is_no_block(attention_models: dict) -> None:
    # the key projection left whole (an MLP pair's here): the query and value alone are no block, their
    # heads would meet all of its heads
    assert blocks_of(attention_models[2], {"block.key.weight"}) == []
    graph, shapes = artifacts("transformer")  # nn.MultiheadAttention: one packed in_proj cut by Slice/Gather
    assert find_attention_blocks(graph, shapes, set()) == []


def test_a_reshape_written_for_all_heads_takes_this_ranks_heads() -> None:
    reshape = ReshapeLocalHeads(2, [16], heads=4)
    local = torch.arange(2 * 3 * 8.0).reshape(2, 3, 8)  # 2 of 4 heads of size 4
    assert reshape(local, (2, 3, 4, 4)).shape == (2, 3, 2, 4)  # split: the heads dimension halved
    assert ReshapeLocalHeads(2, [16], None)(local, (2, 3, 4, 4)).shape == (2, 3, 2, 4)  # 4 x 4: the features
    heads = local.reshape(2, 3, 2, 4)
    assert reshape(heads, (2, 3, 16)).shape == (2, 3, 8)  # merge: the features halved
    assert reshape(heads, (-1, 16)).shape == (6, 8)  # a -1 elsewhere: still halved
    assert reshape(local, (2, 3, -1, 4)).shape == (2, 3, 2, 4)  # -1 in the heads dimension: already this rank's
    assert reshape(local, (2, 3, 2, 4)).shape == (2, 3, 2, 4)  # computed from the local tensor: as is
    with pytest.raises(ModelError, match="expected a heads dimension that is a multiple of 2"):
        ReshapeLocalHeads(2, [12], heads=3)(torch.zeros(2, 3, 6), (2, 3, 3, 4))
