"""The cross-rank strategies of an engine, made from its ``EngineOptions``: gradients combined across ranks
(DDP, Adasum, FSDP2 sharding or tensor parallel, ``distributed/``) and the train step run as a pipeline."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from ort_torch_train.distributed.data_parallel import DataParallel, data_parallel
from ort_torch_train.graph.layout import GraphLayout
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile.settings import for_device, torch_compile
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.options import EngineOptions

if TYPE_CHECKING:  # FSDP2, DTensor and pipelining load Dynamo's shape machinery: imported where used
    from ort_torch_train.distributed.pipeline import PipelineParallel
    from ort_torch_train.distributed.tensor_parallel import TensorParallelPlan


class RankStrategies(NamedTuple):
    """What combines the ranks' gradients (None: one process) and the pipeline the train step runs as
    (None: none)."""

    data_parallel: DataParallel | None
    pipeline: PipelineParallel | None


def rank_strategies(
    graph: ForwardGraph,
    layout: GraphLayout,
    state: TrainingState,
    options: EngineOptions,
    tensor_parallel: TensorParallelPlan | None,
) -> RankStrategies:
    """The strategies ``options`` ask for over the training ``graph`` and ``state``; under sharding and
    tensor parallel the state's parameters (the paired weights) become their shards. Each checks the ranks agree before any step."""
    combined: DataParallel | None = None
    if tensor_parallel is not None:  # the paired weights sharded; gradients averaged over the dp group, if any
        combined = tensor_parallel.ranks(graph, state, options.gradient_combination)
    elif options.sharding is not None:
        from ort_torch_train.distributed.fully_sharded import FullyShardedParallel
        from ort_torch_train.distributed.layer_units import UnitRecompute

        recompute = UnitRecompute.of(options.recompute)  # the legacy patterns: checkpointed in the graph itself
        arguments = options.compile_arguments  # compiled: each layer unit's stretch of the graph on its own
        compiler = None
        if arguments is not None:  # inductor's C++ wrapper cannot generate checkpoint's RNG replay
            compiled = for_device(arguments, options.device, cpp_wrapper=options.recompute is None)
            compiler = partial(torch_compile, arguments=compiled)
        combined = FullyShardedParallel(
            graph, state, layout.params, options.process_group, options.sharding, recompute, compiler
        )
    elif options.distributed:
        combined = data_parallel(graph, state, layout.params, options.process_group, options.gradient_combination)
    pipeline = None
    if options.pipeline is not None:
        from ort_torch_train.distributed.pipeline import pipeline_parallel

        pipeline = pipeline_parallel(
            graph.graph, graph.opsets, layout, graph.constants, state, options.pipeline, options.pipeline_group
        )
    return RankStrategies(combined, pipeline)
