"""The constants a generalised graph rebuilds from its dynamic sizes: grids, relative tables and stacked grids
(``training.graph_literals``), told from other tables and rebuilt at other sizes."""

from __future__ import annotations

import torch

from ort_torch_train.training.graph_literals import grid_like, grid_of, relative_of, stacked_grids


def test_grid_constants_are_told_by_their_start_and_steps():
    """A mask's flat indices over batch x length, token-type ids, an all-True mask and the float zeros an
    MoE layer adds its routed tokens to are grids (rebuilt from the sizes at run time); a table of other
    values is not, nor is a float tensor of more than one value."""
    flat_indices = torch.arange(4).reshape(4, 1, 1, 1) * 8 + torch.arange(8)
    assert grid_of(flat_indices) == (0, (8, 0, 0, 1))
    assert grid_of(torch.zeros(4, 8, dtype=torch.int64)) == (0, (0, 0))
    assert grid_of(torch.ones(1, 1, 8, 1, dtype=torch.bool)) == (True, (0, 0, 0, 0))
    assert grid_of(torch.tensor([[0, 1], [1, 3]])) is None
    assert grid_of(torch.tril(torch.ones(4, 4, dtype=torch.bool))) is None
    assert grid_of(torch.linspace(0, 1, 5)) is None
    assert grid_of(torch.zeros(16, 32)) == (0.0, (0, 0))
    assert grid_of(torch.arange(6, dtype=torch.float32)) is None


def test_relative_tables_are_told_by_their_offsets_and_rebuilt_at_other_lengths():
    """T5's |key - query| (encoder) and max(query - key, 0) (decoder) tables are relative tables, rebuilt
    at any query and key lengths, longer ones included; a table of other values, a float one and one
    with a leading axis longer than 1 are not."""
    offsets = torch.arange(6).reshape(1, 6) - torch.arange(5).reshape(5, 1)
    assert relative_of(offsets.abs()) == (0, 1, 1)
    assert relative_of((-offsets).clamp(min=0).reshape(1, 5, 6)) == (0, 0, 1)
    assert relative_of(offsets.abs() ** 2) is None
    assert relative_of(offsets.abs().float()) is None
    assert relative_of(offsets.abs().expand(2, 5, 6)) is None
    graph = torch.fx.Graph()
    queries, keys = graph.placeholder("queries"), graph.placeholder("keys")
    graph.output(grid_like(graph, (-offsets).clamp(min=0).reshape(1, 5, 6), {("size", 1): queries, ("size", 2): keys}))
    rebuilt = torch.fx.GraphModule(torch.nn.Module(), graph)(9, 11)
    longer = torch.arange(11).reshape(1, 11) - torch.arange(9).reshape(9, 1)
    assert torch.equal(rebuilt, (-longer).clamp(min=0).reshape(1, 9, 11))


def test_index_tuples_over_a_grid_are_stacked_grids_rebuilt_at_other_sizes():
    """A GatherND's (batch, position) index tuples over batch x 1 x length x 1 (a dynamo export's attention
    mask) are stacked grids, rebuilt at a larger batch and a longer length; index tuples of other values
    are not, nor is a tuple axis longer than an index tuple gets."""
    batch, length = torch.arange(4).reshape(4, 1, 1, 1), torch.arange(6).reshape(1, 1, 6, 1)
    tuples = torch.stack(torch.broadcast_tensors(batch, length), -1)
    assert stacked_grids(tuples) == ((0, (1, 0, 0, 0)), (0, (0, 0, 1, 0)))
    assert stacked_grids(tuples**2) is None
    assert stacked_grids(torch.zeros(3, 64, dtype=torch.int64)) is None
    graph = torch.fx.Graph()
    rows, positions = graph.placeholder("rows"), graph.placeholder("positions")
    graph.output(grid_like(graph, tuples, {("size", 0): rows, ("size", 2): positions}))
    rebuilt = torch.fx.GraphModule(torch.nn.Module(), graph)(7, 9)
    larger = torch.arange(7).reshape(7, 1, 1, 1), torch.arange(9).reshape(1, 1, 9, 1)
    assert torch.equal(rebuilt, torch.stack(torch.broadcast_tensors(*larger), -1))
