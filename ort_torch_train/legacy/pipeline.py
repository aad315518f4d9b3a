"""The legacy session's pipeline settings on torch.distributed.pipelining (``distributed/pipeline.py``).

``pipeline_parallel_size`` stages, one per rank of the default process group (initialised here when
the launcher has not done it, as for data parallelism), ``pipeline_cut_info_string`` in ORT's format
(empty: stages balanced by parameter count) and ``num_pipeline_micro_batches``: each ``run``'s batch
is split into that many micro-batches; ``gradient_accumulation_steps`` still counts runs.
"""

from __future__ import annotations

import torch

from ort_torch_train.distributed.pipeline_plan import PipelineOptions
from ort_torch_train.legacy.distributed import join_default_group
from ort_torch_train.legacy.parameters import TrainingParameters


def legacy_pipeline(parameters: TrainingParameters, device: torch.device) -> PipelineOptions | None:
    """The pipeline a legacy session's settings ask for, on the default process group (initialised here
    for a process training on ``device`` when needed); None without one (``pipeline_parallel_size`` 1)."""
    size, micro_batches = parameters.pipeline_parallel_size, parameters.num_pipeline_micro_batches
    cuts = parameters.pipeline_cut_info_string
    if size == 1:
        if micro_batches != 1 or cuts:
            raise ValueError(
                f"TrainingParameters.num_pipeline_micro_batches = {micro_batches!r} / pipeline_cut_info_string = "
                f"{cuts!r} need pipeline_parallel_size > 1"
            )
        return None
    try:
        options = PipelineOptions(stages=size, micro_batches=micro_batches, cuts=cuts)
    except ValueError as error:
        raise ValueError(f"TrainingParameters pipeline settings: {error}") from None
    world_size = parameters.world_size
    if world_size != size or parameters.data_parallel_size != 1:
        raise NotImplementedError(
            f"TrainingParameters.pipeline_parallel_size = {size} with world_size = {world_size} and "
            f"data_parallel_size = {parameters.data_parallel_size}: only a pipeline alone (world_size == "
            "pipeline_parallel_size, data_parallel_size 1) is implemented"
        )
    join_default_group(parameters, device, f"TrainingParameters.pipeline_parallel_size = {size}")
    return options
