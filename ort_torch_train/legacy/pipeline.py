"""The legacy session's pipeline settings on torch.distributed.pipelining (``distributed/pipeline.py``).

``pipeline_parallel_size`` stages, one per rank of the default process group (initialised here when
the launcher has not done it, as for data parallelism), ``pipeline_cut_info_string`` in ORT's format
(empty: stages balanced by parameter count) and ``num_pipeline_micro_batches``: each ``run``'s batch
is split into that many micro-batches; ``gradient_accumulation_steps`` still counts runs. Each rank's
optimizer updates its stage's weights (``StageLegacyOptimizer``); the weights and the optimizer state
read whole are gathered from the stages (collectives).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ort_torch_train.distributed.pipeline_plan import PipelineOptions
from ort_torch_train.legacy.distributed import join_default_group
from ort_torch_train.legacy.moments import STATE_PREFIXES, state_tensors_of
from ort_torch_train.legacy.optimizers import SGD, LegacyOptimizer
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


class StageLegacyOptimizer:
    """A legacy optimizer over the trained weights of this rank's pipeline stage, with the legacy optimizer's
    face: its state read whole (every stage's, gathered: a collective) and loaded in part."""

    def __init__(self, inner: LegacyOptimizer, trained: Sequence[str], group: Any) -> None:
        self.inner = inner
        self.clip_grad_norm = inner.clip_grad_norm
        self.group = group
        self._trained = list(trained)

    def step(self, learning_rate: float, grad_norm: Tensor | None = None) -> None:
        """Update this stage's weights (``grad_norm``: every stage's gradients' norm)."""
        self.inner.step(learning_rate, grad_norm)

    def optimizer_state(self) -> dict[str, dict[str, Tensor]]:
        """Every stage's state, in the trained weights' order (a collective)."""
        stages: list[Any] = [None] * dist.get_world_size(self.group)
        held = {
            weight: {key: value.detach().cpu() for key, value in values.items()}
            for weight, values in self.inner.optimizer_state().items()
        }
        dist.all_gather_object(stages, held, group=self.group)
        merged = {weight: values for stage in stages for weight, values in stage.items()}
        return {weight: merged[weight] for weight in self._trained if weight in merged}

    def state_tensors(self) -> dict[str, Tensor]:
        """ORT's optimizer-state initializers, every stage's (a collective)."""
        return state_tensors_of(self.optimizer_state())

    def load_state_tensor(self, name: str, value: object) -> bool:
        """Load one ``<prefix>_<weight>`` tensor of this stage's weights; one of another stage's is that
        stage's to load (True); False when ``name`` is no optimizer-state tensor."""
        if self.inner.load_state_tensor(name, value):
            return True
        if isinstance(self.inner, SGD):  # no state tensor
            return False
        return any(name == f"{prefix}_{weight}" for prefix in STATE_PREFIXES for weight in self._trained)
