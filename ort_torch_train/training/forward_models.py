"""The train and eval ``ForwardGraph``s an engine runs, made from the artifacts and its ``EngineOptions``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import onnx
import torch

from ort_torch_train.convert.constants import initializer_tensors
from ort_torch_train.convert.registry import check_differentiable
from ort_torch_train.convert.subgraphs import names_read
from ort_torch_train.graph.layout import GraphLayout, forward_graph, opsets_of
from ort_torch_train.passes.pipeline import Restructure
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.forward import CompiledForward
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.recompute import with_recompute
from ort_torch_train.training.recompute_patterns import RecomputePlan, with_pattern_recompute
from ort_torch_train.training.threads import ThreadPolicy

if TYPE_CHECKING:  # DTensor: loaded by tensor-parallel runs only
    from ort_torch_train.distributed.tensor_parallel import TensorParallelPlan


def train_forward(
    training_model: onnx.ModelProto,
    layout: GraphLayout,
    options: EngineOptions,
    trainable_names: Sequence[str],
    tensor_parallel: TensorParallelPlan | None,
) -> ForwardGraph:
    """The training graph pruned to its user outputs, under training semantics (never the eval graph: ORT
    trains what the training model computes).

    Compiled training runs a CompiledTrainStep around it; under recompute it compiles on its own
    (``options.compiles_whole_step`` False), its backward then running through autograd.
    """
    arguments = options.train_forward_compile_arguments
    recompute = options.recompute
    transform: Restructure | None = None
    if isinstance(recompute, RecomputePlan):
        transform = partial(with_pattern_recompute, plan=recompute, user_inputs=len(layout.user_inputs))
    elif recompute is not None and options.sharding is None:  # sharded: each layer unit recomputes its own
        transform = partial(with_recompute, segments=recompute)
    if tensor_parallel is not None:
        transform = tensor_parallel.restructure(then=transform)
    graph, constants = forward_and_constants(training_model, layout)
    if options.custom_ops is not None:
        check_differentiable(graph, list(trainable_names), options.custom_ops)
    return ForwardGraph(
        graph,
        opsets_of(training_model),
        layout,
        training=True,
        compile=False if arguments is None else arguments,
        module_transform=transform,
        dynamic=options.dynamic,
        constants=constants,
        library=options.custom_ops,
    )


def eval_forward(
    eval_model: onnx.ModelProto,
    layout: GraphLayout,
    options: EngineOptions,
    shared: Mapping[str, torch.Tensor],
    cache: CompileCache | None,
    threads: ThreadPolicy,
) -> ForwardGraph:
    """The eval graph under inference semantics; its constants equal to the training graph's (``shared``)
    are those tensors."""
    graph, constants = forward_and_constants(eval_model, layout, shared=shared)
    return ForwardGraph(
        graph,
        opsets_of(eval_model),
        layout,
        training=False,
        compile=False if options.compile_arguments is None else options.compile_arguments,
        compiler=partial(CompiledForward, cache=cache, threads=threads),
        dynamic=options.dynamic,
        constants=constants,
        library=options.custom_ops,
    )


def forward_and_constants(
    model: onnx.ModelProto, layout: GraphLayout, shared: Mapping[str, torch.Tensor] | None = None
) -> tuple[onnx.GraphProto, dict[str, torch.Tensor]]:
    """``model``'s forward graph without initializers, and the values of those it reads: their data is
    read from ``model`` once, not copied into the forward graph's proto first; a value equal to the
    tensor of its name in ``shared`` is that tensor."""
    graph = forward_graph(model, layout, initializers=False)
    return graph, initializer_tensors(model.graph, names_read(graph), shared)
