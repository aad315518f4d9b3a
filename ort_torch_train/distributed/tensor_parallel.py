"""Tensor parallelism (``Module(tensor_parallel_size=N)``, the legacy ``horizontal_parallel_size``).

The default process group's ranks form a 2-D device mesh ``(dp, tp)``: consecutive groups of N ranks
share the work of one model replica (tensor parallel), and the ranks at the same position across
those groups average their gradients (data parallel, with ``distributed=True``). Megatron's weight
pairs of the training graph (``tensor_parallel_patterns.py``) and attention blocks
(``tensor_parallel_attention.py``) run as DTensors sharded across the tp ranks: each rank computes its
slice of the pair's hidden features (of the block's heads), and the output is the sum over the slices.
Each rank holds only its slice of the paired weights (the column-parallel weights and biases by output
features, the row-parallel weights by input features), of their gradients and of their moments; every
other parameter, its gradient and moments stay whole on every rank (``tensor_parallel_ranks.py``). A
checkpoint save, an eval step, an export and reading a parameter through the state gather the slices,
so every rank calls them, and they see the same whole values as one process.

Before the first step, on every rank: the ranks' settings must agree (checked through the store,
with a deadline, so that a rank launched otherwise is an error rather than a hang), the world size
must be a multiple of N (equal to N without ``distributed``), each pair's hidden size and each block's
projections and heads a multiple of N, and the graph must hold at least one pair or block. Linear
layers in none run replicated, with a warning naming them.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import onnx
import torch
import torch.distributed as dist
from torch import fx
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ort_torch_train.distributed.data_parallel import require_identical, require_process_group
from ort_torch_train.distributed.tensor_parallel_attention import (
    AttentionBlock,
    find_attention_blocks,
    shard_attention,
    sharded_block_parameters,
)
from ort_torch_train.distributed.tensor_parallel_patterns import (
    WeightPair,
    find_weight_pairs,
    gather_other_readers,
    parameter_nodes,
    shard_pairs,
    sharded_parameters,
)
from ort_torch_train.distributed.tensor_parallel_ranks import TensorParallelRanks
from ort_torch_train.errors import DistributedError, ModelError
from ort_torch_train.graph.layout import GraphLayout, forward_graph
from ort_torch_train.passes.pipeline import Restructure
from ort_torch_train.state.training_state import TrainingState

SMALL_CONSTANT = 64  # elements of an initializer that shape inference may read for the heads count
AGREEMENT_TIMEOUT = 60.0  # seconds a rank waits for the others' settings
_KEY = "ort_torch_train/tensor_parallel"
_agreements = itertools.count(1)  # tensor-parallel engines built in this process


def check_tensor_parallel_size(value: object) -> int:
    """``value`` when it is a tensor-parallel size (an int >= 1); raises ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"tensor_parallel_size: expected an int >= 1 (1: off), got {value!r}")
    return value


class TensorParallel:
    """The ``(dp, tp)`` device mesh over the default group's ranks (see the module doc)."""

    def __init__(self, size: int, distributed: bool, device: torch.device) -> None:
        require_process_group(None, f"tensor_parallel_size={size}")
        self.size = size
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        agree_on_settings({"tensor_parallel_size": size, "distributed": distributed}, self.rank, self.world_size)
        if self.world_size % size or (not distributed and self.world_size != size):
            expected = f"a multiple of {size}" if distributed else f"{size} (or pass distributed=True for a multiple)"
            raise DistributedError(
                f"tensor_parallel_size={size}: expected a world size of {expected}, got {self.world_size} "
                f"(rank {self.rank})"
            )
        mesh = init_device_mesh(device.type, (self.world_size // size, size), mesh_dim_names=("dp", "tp"))
        self.mesh: DeviceMesh = mesh["tp"]
        self.data_parallel_group: Any = mesh.get_group("dp") if distributed else None

    def __repr__(self) -> str:
        return f"TensorParallel(size={self.size}, world_size={self.world_size})"

    def plan(self, model: onnx.ModelProto, layout: GraphLayout, state: TrainingState) -> TensorParallelPlan:
        """What this mesh shards of ``model``'s training graph over ``state``; raises on every rank
        when nothing can be sharded, a pair does not split into equal slices, or the ranks' parameters
        differ."""
        shapes = {name: tuple(state.params[name].shape) for name in layout.params}
        graph = forward_graph(model, layout, initializers=False)
        pairs, unmatched = find_weight_pairs(graph, shapes)
        paired = {weight for pair in pairs for weight in (pair.column.weight, pair.row.weight)}
        blocks = find_attention_blocks(graph, shapes, paired, small_constants(model, shapes))
        in_blocks = {weight for block in blocks for weight in block.weights}
        unmatched = [weight for weight in unmatched if weight not in in_blocks]
        if not pairs and not blocks:
            raise ModelError(
                f"tensor_parallel_size={self.size}: the training graph has no weight pair or attention block to shard "
                "(a MatMul/Gemm over a parameter, an activation, then another: Megatron's MLP block; or query, key "
                "and value projections, the attention, then an output projection); its linear layers "
                f"{unmatched} match no pattern. Use tensor_parallel_size=1"
            )
        for pair in pairs:
            if pair.column.out_features % self.size:
                raise ModelError(
                    f"tensor_parallel_size={self.size}: the weight pair {pair.name} has {pair.column.out_features} "
                    f"hidden features, expected a multiple of {self.size}"
                )
        for block in blocks:
            if block.heads is not None and block.heads % self.size:
                raise ModelError(
                    f"tensor_parallel_size={self.size}: the attention block {block.name} has {block.heads} heads, "
                    f"expected a multiple of {self.size}"
                )
            for column in block.columns:
                if column.out_features % self.size:
                    raise ModelError(
                        f"tensor_parallel_size={self.size}: the attention block {block.name} projects to "
                        f"{column.out_features} features ({column.weight}), expected a multiple of {self.size}"
                    )
        if unmatched:
            warnings.warn(
                f"tensor_parallel_size={self.size}: the linear layers {unmatched} match no tensor-parallel pattern "
                "and run replicated on every rank",
                stacklevel=2,
            )
        require_identical(
            {name: state.params[name] for name in layout.params},
            dist.group.WORLD,
            "parameters",
        )
        return TensorParallelPlan(self, pairs, blocks, list(layout.params))


class TensorParallelPlan:
    """The weight pairs a ``TensorParallel`` mesh shards in one training graph."""

    def __init__(
        self,
        tensor_parallel: TensorParallel,
        pairs: Sequence[WeightPair],
        blocks: Sequence[AttentionBlock],
        params: Sequence[str],
    ) -> None:
        self.tensor_parallel = tensor_parallel
        self.pairs = list(pairs)
        self.blocks = list(blocks)
        self.params = list(params)

    @property
    def sharded(self) -> dict[str, int]:
        """The parameters held sharded, with the dimension each is cut along."""
        return {**sharded_parameters(self.pairs), **sharded_block_parameters(self.blocks)}

    def restructure(self, then: Restructure | None) -> Restructure:
        """The rewrite that shards the pairs of a converted training graph, followed by ``then``."""

        def rewrite(module: fx.GraphModule) -> fx.GraphModule:
            by_name = parameter_nodes(module, self.params)
            rewritten = shard_pairs(module, self.pairs, by_name, self.tensor_parallel.mesh)
            rewritten |= shard_attention(module, self.blocks, by_name, self.tensor_parallel.mesh)
            gather_other_readers(module.graph, [by_name[name] for name in self.sharded], rewritten)
            module.graph.lint()
            module.recompile()
            return module if then is None else then(module)

        return rewrite

    def ranks(self, graph: Any, state: TrainingState, gradient_combination: str) -> TensorParallelRanks:
        """The strategy that holds ``state``'s paired weights sharded for the training ``graph`` (the state's
        parameters become their shards) and averages the gradients over the data-parallel replicas."""
        mesh = self.tensor_parallel
        return TensorParallelRanks(
            graph, state, self.params, self.sharded, mesh.mesh, mesh.data_parallel_group, gradient_combination
        )


def small_constants(model: onnx.ModelProto, params: Mapping[str, object]) -> list[onnx.TensorProto]:
    """The initializers of ``model`` that are no parameter and hold at most ``SMALL_CONSTANT`` elements
    (shape arithmetic's constants)."""
    return [
        tensor
        for tensor in model.graph.initializer
        if tensor.name not in params and math.prod(tensor.dims) <= SMALL_CONSTANT and not tensor.external_data
    ]


def agree_on_settings(settings: dict[str, Any], rank: int, world_size: int, timeout: float = AGREEMENT_TIMEOUT) -> None:
    """Raise on every rank when the ranks' ``settings`` differ, or when a rank does not publish its own
    within ``timeout`` seconds (launched without them): through the default group's store, no collective."""
    store = dist.group.WORLD.get_group_store()  # type: ignore[union-attr]  # WORLD is set once initialised
    number = next(_agreements)
    store.set(f"{_KEY}/{number}/{rank}", json.dumps(settings, sort_keys=True))
    keys = [f"{_KEY}/{number}/{other}" for other in range(world_size)]
    started = time.monotonic()
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except RuntimeError as error:  # DistStoreError is a RuntimeError
        missing = [other for other, key in enumerate(keys) if not store.check([key])]
        raise DistributedError(
            f"tensor parallel settings {settings} (rank {rank}): ranks {missing} did not build a tensor-parallel "
            f"Module within {time.monotonic() - started:.0f} s; launch every rank with the same settings"
        ) from error
    seen = {other: json.loads(store.get(key)) for other, key in enumerate(keys)}
    differing = {other: theirs for other, theirs in seen.items() if theirs != settings}
    if differing:
        raise DistributedError(
            f"ranks launched with different tensor parallel settings: rank {rank} has {settings}, "
            f"ranks {sorted(differing)} have {[differing[other] for other in sorted(differing)]}; "
            "launch every rank with the same settings"
        )
